"""The build script's pure parts: pins, the go.mod check, the cache layout (no Go needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import build


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_committed_wrapper_module_matches_the_pins() -> None:
    versions = build.load_versions()
    assert build.check_gomod(versions) == []
    assert versions.staging == "v0." + versions.kubernetes.split(".", 1)[1]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("KWOK_VERSION=v0.8.0\nETCD_VERSION=v3.7.0\n", "KUBERNETES_VERSION is missing"),
        ("KUBERNETES_VERSION=1.37\nKWOK_VERSION=v0.8.0\nETCD_VERSION=v3.7.0\n", "not a release version"),
        ("KUBERNETES_VERSION v1.37.2\n", "expected KEY=VALUE"),
    ],
    ids=["missing", "not-semver", "no-equals"],
)
def test_bad_pins_are_rejected_with_the_key_named(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(build.BuildError, match=error):
        build.load_versions(_write(tmp_path / "versions.env", text))


def test_pins_ignore_comments_and_quotes(tmp_path: Path) -> None:
    text = '# pins\n\nKUBERNETES_VERSION="v1.37.2"\nKWOK_VERSION=v0.8.0\nETCD_VERSION=v3.7.0 \n'
    versions = build.load_versions(_write(tmp_path / "versions.env", text))
    assert versions == build.Versions(kubernetes="v1.37.2", kwok="v0.8.0", etcd="v3.7.0")
    assert versions.staging == "v0.37.2"


def test_a_go_mod_that_disagrees_with_the_pins_is_reported(tmp_path: Path) -> None:
    gomod = _write(
        tmp_path / "go.mod",
        "module x\n\nrequire (\n\tk8s.io/kubernetes v1.36.0 // indirect\n\tsigs.k8s.io/kwok v0.8.0\n)\n"
        "require go.etcd.io/etcd/server/v3 v3.7.0\n\n"
        "replace (\n\tk8s.io/api => k8s.io/api v0.36.0\n\tk8s.io/client-go => k8s.io/client-go v0.37.2\n)\n",
    )
    problems = build.check_gomod(build.Versions("v1.37.2", "v0.8.0", "v3.7.0"), gomod)
    assert problems == [
        "requires k8s.io/kubernetes v1.36.0, versions.env pins v1.37.2",
        "replaces k8s.io/api with k8s.io/api v0.36.0, expected v0.37.2",
    ]


def test_binaries_are_cached_outside_the_repository_by_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ICL_E2E_BIN_DIR", raising=False)
    monkeypatch.setenv("ICL_E2E_CACHE", str(tmp_path / "cache"))
    directory = build.bin_dir()
    assert directory == tmp_path / "cache" / build.cache_key() / "bin"
    assert build.missing_binaries(directory) == [t.name for t in build.TARGETS] + [build.KWOK_STAGES]
    directory.mkdir(parents=True)
    for target in build.TARGETS:
        (directory / target.name).write_text("#!/bin/sh\n")
        (directory / target.name).chmod(0o755)
    (directory / build.KWOK_STAGES).write_text("")
    assert build.missing_binaries(directory) == []


def test_without_go_the_build_says_one_line_and_succeeds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert build.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "make e2e-bins" in lines[0]


def test_tools_are_pinned_apart_from_the_control_plane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    versions = build.load_tool_versions()
    assert set(versions) == {t.name for t in build.TOOLS} == {"helm"}
    monkeypatch.delenv("ICL_E2E_TOOLS_DIR", raising=False)
    monkeypatch.setenv("ICL_E2E_CACHE", str(tmp_path / "cache"))
    key, tools = build.cache_key(), build.tool_dir()
    assert tools.parent.parent == tmp_path / "cache" and tools.parent.name.startswith("tools-")
    assert build.tool_path("helm") is None
    bumped = _write(tmp_path / "tools.env", "HELM_VERSION=v4.0.0\n")
    monkeypatch.setattr(build, "TOOLS_FILE", bumped)
    assert build.load_tool_versions(bumped) == {"helm": "v4.0.0"}
    assert build.tool_dir() != tools, "a new pin is a new cache entry"
    assert build.cache_key() == key, "bumping a tool does not rebuild the control plane"


@pytest.mark.parametrize(
    ("text", "error"),
    [("# nothing\n", "HELM_VERSION is missing"), ("HELM_VERSION=4.3\n", "HELM_VERSION='4.3' is not a release")],
    ids=["missing", "not-semver"],
)
def test_bad_tool_pins_are_rejected_with_the_key_named(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(build.BuildError, match=error):
        build.load_tool_versions(_write(tmp_path / "tools.env", text))
