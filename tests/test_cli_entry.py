"""The ``icl`` entry point itself: shared logging options in every position, a closed pipe."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from icl.cli import main

ICL = [sys.executable, "-m", "icl"]


pytestmark = pytest.mark.usefixtures("restore_logging")  # main() sets up logging


POSITIONS = {
    "before the subcommand": ["{opt}", "topo", "show", "ring:2"],
    "after the subcommand": ["topo", "{opt}", "show", "ring:2"],
    "after the verb": ["topo", "show", "{opt}", "ring:2"],
    "at the end": ["topo", "show", "ring:2", "{opt}"],
}


def _argv(where: str, *opt: str) -> list[str]:
    out: list[str] = []
    for word in POSITIONS[where]:
        out += list(opt) if word == "{opt}" else [word]
    return out


@pytest.mark.parametrize("where", POSITIONS)
def test_log_level_debug_works_in_every_position(capsys: pytest.CaptureFixture[str], where: str) -> None:
    assert main(_argv(where, "--log-level", "debug")) == 0
    capsys.readouterr()
    logging.getLogger("deviceplugin.server").debug("a debug line")
    err = capsys.readouterr().err
    assert " DEBUG deviceplugin.server: a debug line" in err


@pytest.mark.parametrize("where", POSITIONS)
def test_json_logs_work_in_every_position(capsys: pytest.CaptureFixture[str], where: str) -> None:
    assert main(_argv(where, "--json-logs")) == 0
    capsys.readouterr()
    logging.getLogger("deviceplugin.server").info("an info line")
    logging.getLogger("deviceplugin.server").debug("not shown at the default level")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert (doc["level"], doc["logger"], doc["msg"]) == ("info", "deviceplugin.server", "an info line")


def test_defaults_and_the_later_option_wins(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topo", "show", "ring:2"]) == 0
    assert logging.getLogger().level == logging.INFO
    assert main(["--log-level", "debug", "topo", "show", "--log-level", "error", "ring:2"]) == 0
    assert logging.getLogger().level == logging.ERROR


def test_plugin_subcommand_takes_the_logging_options_before_it() -> None:
    from icl.cli import build_parser

    args = build_parser().parse_args(["--log-level", "debug", "--json-logs", "plugin", "--backend", "sim"])
    assert (args.log_level, args.json_logs, args.command) == ("debug", True, "plugin")


@pytest.mark.parametrize(
    "argv", [["topo", "show", "torus:8x8"], ["topo", "tour"], ["topo", "encode", "torus:8x8"]], ids=" ".join
)
def test_a_closed_pipe_ends_quietly(argv: list[str]) -> None:
    """``icl topo show ... | head -1``: the reader is gone before the writer is done."""
    read, write = os.pipe()
    os.close(read)  # every write now fails with EPIPE, as after ``head`` exits
    try:
        proc = subprocess.run([*ICL, *argv], stdout=write, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)
    assert proc.stderr == ""
    assert proc.returncode == 1
