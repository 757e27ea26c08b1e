"""The ``icl`` entry point imports only the part it runs: ``icl plugin`` and ``icl extender`` (what the
plugin's and the extender's images run) never import the simulator, matplotlib or the tools beside the product
(the link probe, the topology CLI), so the image's two long-running commands start with what they need."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys

import pytest

from icl.cli import COMMANDS, VERBS_ELSEWHERE, _command_in, build_parser, main

# ``python -m icl ARGV``, then every module the process imported, written to stderr at exit (``-X importtime``
# misses ``importlib.import_module``, which the entry point uses).
PROBE = (
    "import atexit, json, runpy, sys; "
    "atexit.register(lambda: print('MODULES ' + json.dumps(sorted(sys.modules)), file=sys.stderr)); "
    "runpy.run_module('icl', run_name='__main__', alter_sys=True)"
)
UNWANTED = ("simulator", "matplotlib", "scipy", "tests")


pytestmark = pytest.mark.usefixtures("restore_logging")  # main() sets up logging


def _imported(argv: list[str]) -> set[str]:
    """Every module the real ``python -m icl ARGV`` imported."""
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stderr.splitlines() if x.startswith("MODULES "))
    names = set(json.loads(line.removeprefix("MODULES ")))
    assert "icl.cli" in names
    return names


@pytest.mark.parametrize(
    "argv",
    [
        ["plugin", "--help"],
        ["extender", "--help"],
        ["--log-level", "debug", "--json-logs", "plugin", "--help"],
        ["dra", "run", "--help"],
        ["dra", "classes"],
        ["probe", "--help"],
    ],
    ids=" ".join,
)
def test_product_commands_import_neither_the_simulator_nor_plotting(argv: list[str]) -> None:
    names = _imported(argv)
    bad = sorted(n for n in names if n.split(".")[0] in UNWANTED)
    assert not bad, f"icl {' '.join(argv)} imported {bad}"
    assert COMMANDS[_command_in(argv) or ""].split(".")[0] in {n.split(".")[0] for n in names}


@pytest.mark.parametrize("argv", [["plugin", "--help"], ["extender", "--help"]], ids=" ".join)
def test_the_plugin_and_the_extender_import_neither_the_probe_nor_the_topology_cli(argv: list[str]) -> None:
    bad = sorted(n for n in _imported(argv) if n.split(".")[0] in ("probe", "topocli"))
    assert not bad, f"icl {' '.join(argv)} imported {bad}"


def test_the_simulator_commands_still_come_from_the_simulator() -> None:
    # the check above can fail: the same parse sees the simulator where a command does import it
    assert "simulator.sim_cli" in _imported(["sim", "--help"])
    assert "simulator.drasim" not in _imported(["dra", "measure", "--help"])  # imported when it runs, not before


def test_help_lists_every_command_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    positions = [out.index(f"\n    {name} ") for name in COMMANDS]
    assert positions == sorted(positions)


@pytest.mark.parametrize("name", COMMANDS)
def test_each_module_registers_exactly_its_command(name: str) -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    common = argparse.ArgumentParser(add_help=False)
    importlib.import_module(COMMANDS[name]).register(sub, common)
    assert list(sub.choices) == [name]


def test_dra_measure_is_a_verb_of_icl_dra() -> None:
    args = build_parser("dra").parse_args(["dra", "measure", "--trials", "3", "--cap", "8"])
    assert (args.command, args.dra_command, args.trials, args.cap) == ("dra", "measure", 3, [8])
    assert VERBS_ELSEWHERE["dra"] == "icl.dra_measure"


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["plugin", "--backend", "sim"], "plugin"),
        (["--log-level", "debug", "extender"], "extender"),
        (["--log-level=debug", "--json-logs", "topo", "show"], "topo"),
        (["--", "sim"], "sim"),
        (["--version"], None),
        ([], None),
        (["--log-level"], None),
    ],
)
def test_the_command_is_read_from_the_line(argv: list[str], command: str | None) -> None:
    assert _command_in(argv) == command


def test_a_line_the_peek_misreads_still_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """An abbreviated option hides the command from the peek: every command is registered, the line runs."""
    assert _command_in(["--log-l", "error", "topo", "show", "ring:2"]) == "error"
    assert main(["topo", "show", "ring:2"]) == 0
    plain = capsys.readouterr().out
    assert main(["--log-l", "error", "topo", "show", "ring:2"]) == 0
    assert capsys.readouterr().out == plain != ""


def test_an_unknown_command_names_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["plugn"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'plugn'" in err
    assert all(name in err for name in COMMANDS)
