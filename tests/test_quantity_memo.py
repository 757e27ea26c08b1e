"""CPU and memory quantities are parsed once per distinct value; a remembered value answers as a fresh
parse does, and a bool (equal to 1 to Python) is still refused after 1 was remembered."""

from __future__ import annotations

import pytest

from topology.contract import ContractError, cpu_milli, memory_mib


@pytest.mark.parametrize(("value", "milli"), [("1", 1000), (1, 1000), (1.5, 1500), ("250m", 250), ("0.1", 100)])
def test_a_remembered_cpu_quantity_answers_as_a_fresh_parse(value: object, milli: int) -> None:
    assert cpu_milli(value) == cpu_milli(value) == milli


def test_a_bool_is_refused_even_after_one_was_remembered() -> None:
    assert cpu_milli(1) == 1000 and memory_mib(1) == 0
    for parse in (cpu_milli, memory_mib):
        with pytest.raises(ContractError):
            parse(True)


def test_an_unhashable_quantity_is_refused_as_before() -> None:
    with pytest.raises(ContractError):
        cpu_milli({"cpu": "1"})
