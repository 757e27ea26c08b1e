"""The shared argparse validators (``deviceplugin/argtypes.py``) and the commands that use them."""

from __future__ import annotations

import argparse

import pytest

from deviceplugin.argtypes import positive_int, positive_seconds
from deviceplugin.dra import cli as dra_cli
from simulator import kubelet_cli


@pytest.mark.parametrize("text", ["0", "-3", "two", "1.5", ""])
def test_positive_int_refuses_with_one_line_naming_the_value(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=rf"^want a whole number of chips >= 1, got {text!r}$"):
        positive_int("a whole number of chips")(text)


def test_positive_int_accepts() -> None:
    assert positive_int()("1") == 1 and positive_int()(" 42 ") == 42


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "soon"])
def test_positive_seconds_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=rf"^want seconds > 0, got {text!r}$"):
        positive_seconds(text)


def test_positive_seconds_accepts() -> None:
    assert positive_seconds("0.25") == 0.25


def test_the_commands_share_the_helpers_not_copies() -> None:
    for module in (dra_cli, kubelet_cli):
        assert not hasattr(module, "_seconds") and not hasattr(module, "_positive")
        assert module.positive_seconds is positive_seconds


@pytest.mark.parametrize(
    "argv",
    [
        ["dra", "run", "--resync", "inf"],
        ["dra", "run", "--resync", "0"],
        ["dra", "slices", "ring:8", "--max-per-shape", "0"],
    ],
)
def test_icl_dra_refuses_bad_numbers(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from icl.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err
    assert f"got '{argv[-1]}'" in err
