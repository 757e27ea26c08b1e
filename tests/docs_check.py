#!/usr/bin/env python3
"""Run every shell command shown in README.md and docs/*.md and check the output they document.

A document's commands live in fenced blocks tagged ``console``, ``sh`` or ``bash``:

- ``console`` blocks: a line starting with ``$ `` is a command (a trailing ``\\`` continues it on
  the next line); the lines up to the next command are its documented output. Each documented
  line must match a line of the real output, in order (lines in between may be left out); ``...``
  inside a documented line stands for any text. A documented line ``(exit N)`` says the command
  exits with N; otherwise it must exit 0.
- ``sh``/``bash`` blocks: every line that is not a comment is a command (same continuation rule),
  with no documented output; each must exit 0.

All blocks of one document run in one bash process, in order, from the repository root with
``.venv/bin`` first on ``PATH`` (so ``icl`` and ``python`` are the project's), so a plugin started
with ``&`` in one block is still there for the next one and ``kill %1`` stops it. Background jobs
left at the end are stopped.

A block that cannot run here (a GPU, a real cluster, a command that is CI itself) is skipped only
with a reason: an HTML comment ``<!-- docs-check: skip REASON -->`` on the line before the block,
or an entry in :data:`SKIP_COMMANDS` for a single command. The report lists every skip and its
reason, so nothing is left out silently.

Usage::

    .venv/bin/python tests/docs_check.py                 # README.md and docs/*.md
    .venv/bin/python tests/docs_check.py docs/topology.md
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "SKIP_COMMANDS",
    "Block",
    "Command",
    "CommandResult",
    "DocsCheckError",
    "match_output",
    "parse_document",
    "run_document",
]

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
SKIP_MARK = re.compile(r"<!--\s*docs-check:\s*skip\s+(?P<reason>.+?)\s*-->")
EXIT_LINE = re.compile(r"^\(exit (\d+)\)$")
RUN_KINDS = frozenset({"console", "sh", "bash"})
DOC_TIMEOUT_S = 900.0

# Single commands that are shown but not run here, with the reason.
SKIP_COMMANDS: dict[str, str] = {
    "make test": "it is the CI command that runs this check",
    "make e2e-bins && .venv/bin/python -m pytest tests/e2e": "the e2e suite runs in make test already",
    ".venv/bin/icl extender --config extender.yaml --kubeconfig ~/.kube/config": "needs a cluster's API server",
}


class DocsCheckError(ValueError):
    """A document's block cannot be parsed (an unclosed fence, a console block without a command)."""


@dataclass(frozen=True, slots=True)
class Command:
    text: str
    line: int
    expected: tuple[str, ...] = ()
    exit_code: int = 0


@dataclass(frozen=True, slots=True)
class Block:
    path: str
    line: int
    kind: str
    commands: tuple[Command, ...]
    skip: str | None = None


@dataclass(slots=True)
class CommandResult:
    command: Command
    skipped: str | None = None
    rc: int | None = None
    output: str = ""
    problems: list[str] = field(default_factory=list)


def _strip_comment(line: str) -> str:
    """A shell line without a trailing comment (``#`` outside quotes, after whitespace)."""
    quote: str | None = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _join_continuations(lines: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for lineno, text in lines:
        pending = (pending[0], pending[1] + "\n" + text) if pending is not None else (lineno, text)
        if not text.rstrip().endswith("\\"):
            out.append(pending)
            pending = None
    if pending is not None:
        out.append(pending)
    return out


def _parse_console(path: str, start: int, body: Sequence[tuple[int, str]]) -> tuple[Command, ...]:
    commands: list[Command] = []
    current: list[tuple[int, str]] = []
    expected: list[str] = []
    in_continuation = False

    def flush() -> None:
        if not current:
            return
        text = "\n".join(t for _, t in current)
        exit_code = 0
        lines = []
        for e in expected:
            m = EXIT_LINE.match(e.strip())
            if m:
                exit_code = int(m.group(1))
            else:
                lines.append(e)
        commands.append(Command(_strip_comment(text), current[0][0], tuple(lines), exit_code))

    for lineno, raw in body:
        text = raw.strip()
        if in_continuation:
            current.append((lineno, text))
            in_continuation = text.endswith("\\")
            continue
        if text.startswith("$ "):
            flush()
            current = [(lineno, text[2:])]
            expected = []
            in_continuation = text.endswith("\\")
        elif current:
            if text:
                expected.append(text)
        elif text:
            raise DocsCheckError(f"{path}:{lineno}: console block of line {start} has output before any '$ ' command")
    flush()
    return tuple(commands)


def _parse_script(body: Sequence[tuple[int, str]]) -> tuple[Command, ...]:
    lines = [(n, t.strip()) for n, t in body if t.strip() and not t.strip().startswith("#")]
    return tuple(Command(_strip_comment(text), n) for n, text in _join_continuations(lines))


def parse_document(path: Path) -> list[Block]:
    """The runnable blocks of one Markdown document, in order."""
    rel = str(path.relative_to(ROOT)) if path.is_absolute() and path.is_relative_to(ROOT) else str(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m.group(2):
            i += 1
            continue
        kind, start = m.group(2), i + 1
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        if j == len(lines):
            raise DocsCheckError(f"{rel}:{start}: the ```{kind} block is never closed")
        if kind in RUN_KINDS:
            body = [(k + 1, lines[k]) for k in range(i + 1, j)]
            prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            skip = SKIP_MARK.search(prev)
            cmds = _parse_console(rel, start, body) if kind == "console" else _parse_script(body)
            blocks.append(Block(rel, start, kind, cmds, skip.group("reason") if skip else None))
        i = j + 1
    return blocks


def _line_pattern(expected: str) -> re.Pattern[str]:
    parts = [re.escape(p) for p in expected.rstrip().split("...")]
    return re.compile(r"\s*" + ".*".join(parts) + r"\s*")


def match_output(expected: Iterable[str], output: str) -> list[str]:
    """Documented lines that the output lacks (in order; ``...`` is any text); empty when all are there."""
    actual = [line.rstrip() for line in output.splitlines()]
    pos = 0
    missing: list[str] = []
    for line in expected:
        pattern = _line_pattern(line)
        for k in range(pos, len(actual)):
            if pattern.fullmatch(actual[k]):
                pos = k + 1
                break
        else:
            missing.append(line)
    return missing


def _script(commands: Sequence[Command], work: Path) -> str:
    venv_bin = ROOT / ".venv" / "bin"
    out = [
        "set +e",
        f"cd {shlex.quote(str(ROOT))}",
        f"export PATH={shlex.quote(str(venv_bin))}:$PATH",
        "export PYTHONUNBUFFERED=1",
    ]
    for k, cmd in enumerate(commands):
        o, rc = shlex.quote(str(work / f"{k}.out")), shlex.quote(str(work / f"{k}.rc"))
        out.append(f"{{\n{cmd.text}\n}} >{o} 2>&1 </dev/null; echo $? >{rc}")
        if cmd.text.rstrip().endswith("&"):
            out.append("sleep 2")  # let a background service come up before the next command talks to it
    out.append("for p in $(jobs -p); do kill -TERM $p 2>/dev/null; done; wait")
    return "\n".join(out) + "\n"


def run_document(blocks: Sequence[Block], *, timeout_s: float = DOC_TIMEOUT_S) -> list[CommandResult]:
    """Run a document's blocks in one bash process; one result per command shown."""
    results: list[CommandResult] = []
    to_run: list[Command] = []
    for block in blocks:
        for cmd in block.commands:
            reason = block.skip or SKIP_COMMANDS.get(cmd.text.strip())
            results.append(CommandResult(cmd, skipped=reason))
            if reason is None:
                to_run.append(cmd)
    if not to_run:
        return results
    with tempfile.TemporaryDirectory(prefix="docs-check-") as tmp:
        work = Path(tmp)
        script = work / "run.sh"
        script.write_text(_script(to_run, work), encoding="utf-8")
        # A session of its own, so that a timeout stops the background services the document started too.
        proc = subprocess.Popen(["bash", str(script)], start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        k = 0
        for res in results:
            if res.skipped is not None:
                continue
            out_f, rc_f = work / f"{k}.out", work / f"{k}.rc"
            k += 1
            res.output = out_f.read_text(encoding="utf-8", errors="replace") if out_f.exists() else ""
            if not rc_f.exists():
                res.problems.append(f"did not finish within {timeout_s:.0f} s")
                continue
            res.rc = int(rc_f.read_text().strip() or "-1")
            if res.rc != res.command.exit_code:
                res.problems.append(f"exit {res.rc}, documented {res.command.exit_code}")
            res.problems.extend(f"output lacks: {line}" for line in match_output(res.command.expected, res.output))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README.md docs/*.md)")
    args = ap.parse_args(argv)
    files = args.files or [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    failed = 0
    for f in files:
        path = f if f.is_absolute() else (Path.cwd() / f).resolve()
        try:
            blocks = parse_document(path)
        except (OSError, DocsCheckError) as exc:
            print(f"docs-check: {exc}", file=sys.stderr)
            return 2
        t0 = time.monotonic()
        n = sum(len(b.commands) for b in blocks)
        print(f"docs-check: {path.name}: {n} commands ...", file=sys.stderr, flush=True)
        for res in run_document(blocks):
            where = f"{path.name}:{res.command.line}"
            first = res.command.text.splitlines()[0]
            if res.skipped is not None:
                print(f"  skip  {where}  {first}  ({res.skipped})")
            elif res.problems:
                failed += 1
                print(f"  FAIL  {where}  {first}")
                for p in res.problems:
                    print(f"          {p}")
                tail = "\n".join(res.output.splitlines()[-15:])
                print("          output (last lines):\n" + "\n".join("            " + t for t in tail.splitlines()))
            else:
                print(f"  ok    {where}  {first}")
        print(f"docs-check: {path.name}: done in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
