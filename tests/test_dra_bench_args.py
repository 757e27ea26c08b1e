"""The DRA sides' options, parsed once (``bench.dra_throughput.add_pool_arguments``) for both benches:
``bench/dra_throughput.py --shapes/--max-per-shape/--subset/--modes`` and ``bench/e2e_throughput.py --dra-*``.
Bad values are one line naming the option (as the bench spells it) and the value; nothing is started."""

from __future__ import annotations

import argparse

import pytest

from bench.dra_throughput import MODES, add_pool_arguments, pool_arguments
from bench.dra_throughput import main as dra_main
from bench.e2e_throughput import main as e2e_main
from topology import parse_shape


@pytest.mark.parametrize("prefix", ["", "dra-"])
def test_the_options_give_the_pools_and_the_sides(prefix: str) -> None:
    parser = argparse.ArgumentParser()
    add_pool_arguments(parser, prefix)
    argv = [f"--{prefix}shapes", "ring:4,mesh:2x2", f"--{prefix}max-per-shape", "3", f"--{prefix}subset", "tiled"]
    args = parser.parse_args([*argv, f"--{prefix}modes", " taints , plain,"])
    pool, modes = pool_arguments(parser, args, prefix)
    assert pool.shapes == (parse_shape("ring:4"), parse_shape("mesh:2x2"))
    assert (pool.max_per_shape, pool.subset, modes) == (3, "tiled", ["taints", "plain"])
    pool, modes = pool_arguments(parser, parser.parse_args([]), prefix)
    assert modes == ["cel"] and pool.subset == "compact"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--modes", "cel,bogus"], f"--modes: bogus: want some of {', '.join(MODES)}"),
        (["--modes", " , "], "--modes: none given"),
        (["--shapes", "ring:3x"], "--shapes/--max-per-shape: shapes: shape: 'ring:3x'"),
        (["--max-per-shape", "0"], "--shapes/--max-per-shape: max_per_shape: must be >= 1, got 0"),
    ],
)
def test_bad_values_are_one_line_naming_the_option_in_each_bench(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for main, prefix in ((dra_main, "--"), (e2e_main, "--dra-")):
        with pytest.raises(SystemExit) as exited:
            main([a.replace("--", prefix, 1) if a.startswith("--") else a for a in argv])
        assert exited.value.code == 2
        (line,) = [x for x in capsys.readouterr().err.splitlines() if "error:" in x]
        assert message.replace("--", prefix) in line, line
