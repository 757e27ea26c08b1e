"""The Dockerfile as the image build reads it: instructions and stages, Docker's ``$VAR`` substitution,
``KEY=VALUE`` and exec-form arguments, ``COPY``'s flags, and the build context (``.dockerignore`` rules and
the files the ``COPY`` steps read)."""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hack.image.host import BuildError

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


# =========================================================================== the Dockerfile


@dataclass(slots=True)
class Instruction:
    keyword: str  # upper case
    text: str  # the arguments, continuation lines joined
    line: int


@dataclass(slots=True)
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)


@dataclass(slots=True)
class Dockerfile:
    global_args: list[Instruction]
    stages: list[Stage]


SUPPORTED = {"ARG", "FROM", "ENV", "RUN", "COPY", "WORKDIR", "USER", "LABEL", "ENTRYPOINT", "CMD"}


def parse_dockerfile(text: str, path: Path = DOCKERFILE) -> Dockerfile:
    """Split into instructions (``\\`` continuations joined, comments dropped) and stages."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment line inside a continued instruction, as Docker allows
        if not pending:
            start = number
        if raw.rstrip().endswith("\\"):
            pending.append(raw.rstrip()[:-1])
            continue
        pending.append(raw)
        joined = " ".join(part.strip() for part in pending if part.strip())
        pending = []
        keyword, _, rest = joined.partition(" ")
        keyword = keyword.upper()
        if keyword not in SUPPORTED:
            raise BuildError(f"{path.name}:{start}: {keyword} is not supported by hack/image/build.py")
        instructions.append(Instruction(keyword, rest.strip(), start))
    if pending:
        raise BuildError(f"{path.name}:{start}: the last instruction ends with a line continuation")
    global_args: list[Instruction] = []
    stages: list[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            words = ins.text.split()
            if len(words) == 3 and words[1].upper() == "AS":
                stages.append(Stage(words[0], words[2]))
            elif len(words) == 1:
                stages.append(Stage(words[0], None))
            else:
                raise BuildError(f"{path.name}:{ins.line}: FROM takes IMAGE [AS NAME], got {ins.text!r}")
        elif not stages:
            if ins.keyword != "ARG":
                raise BuildError(f"{path.name}:{ins.line}: only ARG may come before the first FROM")
            global_args.append(ins)
        else:
            stages[-1].instructions.append(ins)
    if not stages:
        raise BuildError(f"{path.name}: no FROM")
    return Dockerfile(global_args, stages)


_VAR = re.compile(r"\\\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Docker's substitution of ``$VAR`` and ``${VAR}`` (unset: empty; ``\\$`` is a literal dollar)."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "\\$":
            return "$"
        return env.get(match.group(1) or match.group(2), "")

    return _VAR.sub(replace, text)


def key_values(ins: Instruction, env: Mapping[str, str]) -> list[tuple[str, str]]:
    """``KEY=VALUE ...`` of ENV, LABEL and ARG (quotes as in a shell; values expanded)."""
    pairs: list[tuple[str, str]] = []
    for word in shlex.split(ins.text):
        key, sep, value = word.partition("=")
        if not key or (not sep and ins.keyword != "ARG"):
            raise BuildError(f"Dockerfile:{ins.line}: {ins.keyword} wants KEY=VALUE, got {word!r}")
        pairs.append((key, expand(value, env) if sep else ""))
    return pairs


def exec_form(ins: Instruction) -> list[str]:
    try:
        value = json.loads(ins.text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BuildError(f"Dockerfile:{ins.line}: {ins.keyword} must be a JSON list of strings (exec form)")
    return value


def global_arg_values(dockerfile: Dockerfile, build_args: Mapping[str, str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for ins in dockerfile.global_args:
        for key, value in key_values(ins, values):
            values[key] = build_args.get(key, value)
    return values


def dockerfile_defaults(path: Path = DOCKERFILE) -> dict[str, str]:
    """Every ARG's default in the file (global and per stage), for tests and the cache key."""
    parsed = parse_dockerfile(path.read_text(), path)
    out: dict[str, str] = {}
    for ins in [*parsed.global_args, *(i for s in parsed.stages for i in s.instructions)]:
        if ins.keyword == "ARG":
            out.update(key_values(ins, out))
    return out


def copy_words(ins: Instruction, env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """COPY's ``--from``/``--chown`` flags and its sources and destination, expanded."""
    flags: dict[str, str] = {}
    words = [expand(w, env) for w in shlex.split(ins.text)]
    while words and words[0].startswith("--"):
        key, _, value = words.pop(0)[2:].partition("=")
        if key not in ("from", "chown"):
            raise BuildError(f"Dockerfile:{ins.line}: COPY --{key} is not supported by hack/image/build.py")
        flags[key] = value
    if len(words) < 2:
        raise BuildError(f"Dockerfile:{ins.line}: COPY needs a source and a destination")
    return flags, words


def context_sources(dockerfile: Dockerfile, args: Mapping[str, str]) -> list[str]:
    """What the ``COPY`` steps without ``--from`` read from the build context, in order."""
    sources: list[str] = []
    for stage in dockerfile.stages:
        for ins in stage.instructions:
            if ins.keyword == "COPY":
                flags, words = copy_words(ins, args)
                if "from" not in flags:
                    sources.extend(words[:-1])
    return sources


# =========================================================================== .dockerignore and the context


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


class IgnoreRules:
    """``.dockerignore``: a path is left out when the last pattern matching it or a parent is not ``!``."""

    def __init__(self, text: str) -> None:
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            pattern = os.path.normpath(line[1:].strip() if negated else line).lstrip("/")
            self.rules.append((negated, _pattern_regex(pattern)))

    def ignored(self, relpath: str) -> bool:
        parts = relpath.split("/")
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        result = False
        for negated, regex in self.rules:
            if any(regex.match(c) for c in candidates):
                result = not negated
        return result


def join_relative(rel: str, name: str) -> str:
    """``name`` under the context-relative directory ``rel`` (``""`` or ``"."`` is the top)."""
    return name if rel in ("", ".") else f"{rel}/{name}"


def context_files(sources: Sequence[str], rules: IgnoreRules) -> list[Path]:
    """Every file or link under the context sources, less what ``.dockerignore`` leaves out, sorted."""
    found: list[Path] = []
    for source in sources:
        top = ROOT / source
        if not top.exists() and not top.is_symlink():
            raise BuildError(f"COPY {source}: no such file in the build context {ROOT}")
        if os.path.normpath(source) != "." and rules.ignored(os.path.normpath(source)):
            raise BuildError(f"COPY {source}: excluded by .dockerignore")
        if top.is_dir() and not top.is_symlink():
            for dirpath, dirnames, filenames in os.walk(top):
                rel_dir = Path(dirpath).relative_to(ROOT).as_posix()
                dirnames[:] = sorted(d for d in dirnames if not rules.ignored(join_relative(rel_dir, d)))
                found.extend(
                    Path(dirpath, f) for f in sorted(filenames) if not rules.ignored(join_relative(rel_dir, f))
                )
        else:
            found.append(top)
    return found
