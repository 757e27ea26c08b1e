"""``icl demo`` on a terminal: its tables and pictures, with the logs of the extender that the
simulator's time mode runs shown from warning up unless ``--log-level`` asks for more. The demo's
second part runs a small time-mode replay here (one policy, a few jobs) through the demo's own entry."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import icl.demo
from icl.cli import main

# A log record as icl's formatter writes it: "2024-01-01 12:00:00,000 INFO scheduler.gang: ..."
RECORD = re.compile(r"^\S+ \S+ (?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<logger>\S+): ")
SMALL_SIM = ("sim", "--mode", "time", "--jobs", "40", "--policies", "icl", "--no-progress")


def records(stderr: str, level: str) -> list[str]:
    """The log records of ``level`` in ``stderr``."""
    return [line for line in stderr.splitlines() if (m := RECORD.match(line)) and m["level"] == level]


@pytest.fixture
def small_sim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(icl.demo, "SIM", SMALL_SIM)


@pytest.mark.usefixtures("small_sim")
def test_the_demo_prints_no_info_log_record_by_default(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["demo", "--no-tour", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert f"open {tmp_path}/report.html" in out
    assert records(err, "INFO") == []
    # the report names the sim's own command: the demo's logging is no option of it
    command = json.loads((tmp_path / "metrics.json").read_text())["command"]
    assert command == f"icl sim --mode time --jobs 40 --policies icl --out {tmp_path} --no-progress"


@pytest.mark.usefixtures("small_sim")
@pytest.mark.parametrize("before", [False, True], ids=["after-demo", "before-demo"])
def test_the_demo_shows_the_extenders_info_records_when_asked(
    before: bool, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    level = ["--log-level", "info"]
    argv = [*level, "demo"] if before else ["demo", *level]
    assert main([*argv, "--no-tour", "--out", str(tmp_path)]) == 0
    info = records(capsys.readouterr().err, "INFO")
    assert any(RECORD.match(line)["logger"].startswith("scheduler.") for line in info), info  # type: ignore[index]
