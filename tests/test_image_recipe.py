"""The image recipe without building it: lock files against pyproject.toml, the Dockerfile's defaults,
the build context, and the pieces of the image builder (hack/image/) that read Docker's formats."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from hack.image import build, dockerfile, host, rootfs

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;\\]+)")


def read_lock(path: Path) -> dict[str, tuple[str, list[str]]]:
    """``name -> (version, [sha256 hashes])`` of a ``--generate-hashes`` lock; anything unpinned fails."""
    pins: dict[str, tuple[str, list[str]]] = {}
    current: str | None = None
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("--hash="):
            assert current is not None, f"{path.name}:{number}: a hash before any requirement"
            algorithm, _, digest = stripped.removeprefix("--hash=").rstrip(" \\").partition(":")
            assert algorithm == "sha256" and re.fullmatch(r"[0-9a-f]{64}", digest), f"{path.name}:{number}"
            pins[current][1].append(digest)
            continue
        match = _PIN.match(stripped)
        assert match, f"{path.name}:{number}: not an exact pin: {stripped!r}"
        current = canonicalize_name(match.group(1))
        assert current not in pins, f"{path.name}:{number}: {current} pinned twice"
        pins[current] = (match.group(3), [])
    return pins


@pytest.mark.parametrize("lock", ["requirements.lock", "build-requirements.lock"])
def test_every_locked_package_is_exact_and_hashed(lock: str) -> None:
    pins = read_lock(ROOT / "hack" / "image" / lock)
    assert pins
    assert all(hashes for _, hashes in pins.values()), [n for n, (_, h) in pins.items() if not h]


def _check_covers(requirements: list[str], pins: dict[str, tuple[str, list[str]]]) -> list[str]:
    problems = []
    for text in requirements:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name == "kube-icl":
            continue
        if req.marker is not None and not req.marker.evaluate({"python_version": "3.11", "sys_platform": "linux"}):
            continue
        if name not in pins:
            problems.append(f"{req} is not locked")
        elif not req.specifier.contains(pins[name][0], prereleases=True):
            problems.append(f"{req} but the lock pins {pins[name][0]}")
    return problems


def test_runtime_lock_covers_the_dependencies_and_the_nvml_extra() -> None:
    pins = read_lock(ROOT / "hack" / "image" / "requirements.lock")
    wanted = [*PYPROJECT["project"]["dependencies"], *PYPROJECT["project"]["optional-dependencies"]["nvml"]]
    assert _check_covers(wanted, pins) == [], "run `make lock`"


def test_runtime_lock_leaves_plotting_and_dev_tools_out() -> None:
    pins = read_lock(ROOT / "hack" / "image" / "requirements.lock")
    for extra in ("plot", "dev"):
        for text in PYPROJECT["project"]["optional-dependencies"][extra]:
            name = canonicalize_name(Requirement(text).name)
            assert name == "kube-icl" or name not in pins, f"{name} ({extra} extra) is in the image lock"


def test_build_lock_covers_the_build_system_and_pip() -> None:
    pins = read_lock(ROOT / "hack" / "image" / "build-requirements.lock")
    assert _check_covers([*PYPROJECT["build-system"]["requires"], "pip"], pins) == [], "run `make lock`"


def test_dockerfile_version_default_is_the_package_version() -> None:
    defaults = dockerfile.dockerfile_defaults()
    assert defaults["VERSION"] == PYPROJECT["project"]["version"]
    assert rootfs.codename_of(defaults["BASE"]) == "bookworm"


def test_final_stage_runs_icl_as_a_non_root_user() -> None:
    parsed = dockerfile.parse_dockerfile(dockerfile.DOCKERFILE.read_text())
    final = parsed.stages[-1].instructions
    users = [i.text for i in final if i.keyword == "USER"]
    assert users and not users[-1].startswith(("0", "root"))
    entry = [dockerfile.exec_form(i) for i in final if i.keyword == "ENTRYPOINT"]
    assert entry == [["icl"]]
    labels = dict(pair for i in final if i.keyword == "LABEL" for pair in dockerfile.key_values(i, {}))
    for key in ("source", "version", "revision", "licenses", "title", "description"):
        assert f"org.opencontainers.image.{key}" in labels, key


def test_build_context_holds_every_package_and_leaves_tests_out() -> None:
    rules = dockerfile.IgnoreRules(dockerfile.DOCKERIGNORE.read_text())
    files = {p.relative_to(ROOT).as_posix() for p in dockerfile.context_files(["."], rules)}
    for pattern in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]:
        package = pattern.rstrip("*")
        assert f"{package}/__init__.py" in files, f"{package} is not in the image's build context (.dockerignore)"
    for needed in ("pyproject.toml", "README.md", "hack/image/requirements.lock", "hack/image/build-requirements.lock"):
        assert needed in files
    assert not any(f.startswith(("tests/", ".venv/", ".git/", "docs/")) or "__pycache__" in f for f in files)


@pytest.mark.parametrize(
    ("rules", "path", "ignored"),
    [
        ("*\n!topology\n", "topology/x.py", False),
        ("*\n!topology\n", "docs/a.md", True),
        ("tests\n", "tests/e2e/harness.py", True),
        ("tests\n", "mytests/x.py", False),
        ("**/__pycache__\n", "a/b/__pycache__/c.pyc", True),
        ("**/*.pyc\n", "top.pyc", True),
        ("docs\n!docs/image.md\n", "docs/image.md", False),
        ("docs/*.md\n", "docs/sub/a.md", False),
        ("# comment\n\n/build\n", "build/x", True),
    ],
)
def test_dockerignore_rules(rules: str, path: str, ignored: bool) -> None:
    assert dockerfile.IgnoreRules(rules).ignored(path) is ignored


def test_substitution_and_key_values_as_docker() -> None:
    env = {"A": "x", "B": "y"}
    assert dockerfile.expand("${A}-$B-$C-\\$A", env) == "x-y--$A"
    ins = dockerfile.Instruction("ENV", 'P=/opt/bin:$A Q="two words" R=${B}', 1)
    assert dockerfile.key_values(ins, env) == [("P", "/opt/bin:x"), ("Q", "two words"), ("R", "y")]


def test_parser_refuses_what_it_cannot_build() -> None:
    with pytest.raises(host.BuildError, match="ADD is not supported"):
        dockerfile.parse_dockerfile("FROM debian:12-slim\nADD x /x\n")
    with pytest.raises(host.BuildError, match="only ARG may come before"):
        dockerfile.parse_dockerfile("RUN true\nFROM debian:12-slim\n")
    with pytest.raises(host.BuildError, match="reproduces only debian"):
        rootfs.codename_of("python:3.11-slim")
    parsed = dockerfile.parse_dockerfile("ARG X=1\nFROM a AS b\nRUN echo \\\n  # note\n  two\n")
    assert [i.text for i in parsed.stages[0].instructions] == ["echo two"]


def test_mirrors_come_from_the_hosts_apt_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n"
    )
    mirrors = rootfs.host_mirrors(tmp_path)
    assert (mirrors.archive, mirrors.security) == (
        "http://mirror.example/debian",
        "http://mirror.example/debian-security",
    )
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text("deb [arch=amd64] http://other.example/debian bookworm main\n")
    assert rootfs.host_mirrors(tmp_path) == rootfs.Mirrors("http://other.example/debian", None)
    (tmp_path / "sources.list").write_text("# nothing\n")
    with pytest.raises(host.BuildError, match="no Debian archive"):
        rootfs.host_mirrors(tmp_path)


def test_build_without_root_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("ICL_IMAGE_CACHE", str(tmp_path))
    monkeypatch.setattr(build.os, "geteuid", lambda: 1000)
    assert build.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs root" in err and "docker build" in err
    assert list(tmp_path.iterdir()) == []  # nothing started
    assert build.main(["--print-dir"]) == 0
    assert capsys.readouterr().out.startswith(str(tmp_path / "image-"))
