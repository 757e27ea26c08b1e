#!/usr/bin/env python3
"""The version matrix: the chart, plugin, extender, gang and DRA e2e subsets on each older maintained minor.

The newest minor (``tests/e2e/versions.env``) runs every test in ``make test``; each older one has its
pins in ``tests/e2e/matrix/<minor>/versions.env`` and its wrapper module beside them, and its own cache
entry (``ICL_E2E_MINOR=<minor>``, tests/e2e/build.py). For each minor this builds the control plane
when asked (``--build``; about 25 minutes cold on 2 cores) or only when it is cached (``--cached-only``,
what ``.ci/run`` does: a cold CI machine must stay inside its time limit), runs :data:`SUBSET` against
it, and prints one line per minor and, last, which minors ran::

    python3 tests/e2e/matrix.py --build          # make test-matrix
    python3 tests/e2e/matrix.py --cached-only    # .ci/run, after make test

Standard library only; pytest runs from the repository's virtual environment.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MATRIX = HERE / "matrix"
SUBSET = (
    "tests/e2e/test_control_plane.py",
    "tests/e2e/test_chart.py",
    "tests/e2e/test_plugin_e2e.py",
    "tests/e2e/test_extender_e2e.py",
    "tests/e2e/test_gang_adjacent_nodes_e2e.py",
    "tests/e2e/test_dra_e2e.py",
)
RESULTS = MATRIX / "results.json"


def minors() -> list[str]:
    """The older minors with pins, newest first."""
    found = [p.name for p in MATRIX.iterdir() if (p / "versions.env").is_file()] if MATRIX.is_dir() else []
    return sorted(found, key=lambda m: tuple(int(x) for x in m.split(".")), reverse=True)


def unclaimed(minor: str) -> set[str]:
    """The subset's files this minor does not run (``matrix/<minor>/unclaimed``: what the docs do not claim
    there, each with its reason in a comment)."""
    path = MATRIX / minor / "unclaimed"
    if not path.is_file():
        return set()
    return {line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")}


def _build_module(minor: str) -> object:
    """tests/e2e/build.py with the minor's pins (it reads ``ICL_E2E_MINOR`` when imported)."""
    os.environ["ICL_E2E_MINOR"] = minor
    sys.modules.pop("build", None)
    sys.path.insert(0, str(HERE))
    try:
        import build
    finally:
        sys.path.remove(str(HERE))
    return build


def run_minor(minor: str, *, build_missing: bool, python: str) -> dict[str, object]:
    build = _build_module(minor)
    versions = build.load_versions()  # type: ignore[attr-defined]
    missing = build.missing_binaries()  # type: ignore[attr-defined]
    row: dict[str, object] = {"minor": minor, "kubernetes": versions.kubernetes}
    if missing and not build_missing:
        row["result"] = "not cached (skipped)"
        return row
    if missing:
        build.build()  # type: ignore[attr-defined]
    env = {**os.environ, "ICL_E2E_MINOR": minor, "ICL_E2E_REQUIRED": "1"}
    started = time.monotonic()
    left_out = unclaimed(minor)
    if left_out:
        row["not claimed"] = sorted(left_out)
    command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "e2e"]
    command += [f for f in SUBSET if f not in left_out]
    print(f"matrix: {minor} ({versions.kubernetes}): {' '.join(command[1:])}", flush=True)
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    summary = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
    row.update(result="passed" if result.returncode == 0 else "failed", summary=summary)
    row["seconds"] = round(time.monotonic() - started)
    if result.returncode != 0:
        print(result.stdout[-6000:], flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--build", action="store_true", help="build a minor's control plane when it is missing")
    mode.add_argument("--cached-only", action="store_true", help="run only the minors whose build is cached")
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--record", action="store_true", help=f"write the results to {RESULTS.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    rows = [run_minor(m, build_missing=args.build, python=args.python) for m in minors()]
    for row in rows:
        print(f"matrix: {row['minor']} ({row['kubernetes']}): {row['result']} {row.get('summary', '')}".rstrip())
        if row.get("not claimed"):
            print(f"matrix: {row['minor']}: not run, not claimed there: {', '.join(row['not claimed'])}")
    if args.record:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        record = {"date": dt.date.today().isoformat(), "commit": commit.stdout.strip(), "minors": rows}
        RESULTS.write_text(json.dumps(record, indent=1) + "\n")
    ran = [f"{r['minor']} {r['result']}" for r in rows if r["result"] in ("passed", "failed")]
    print(f"matrix: minors run: newest (make test){''.join(', ' + r for r in ran)}")
    return 1 if any(r["result"] == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
