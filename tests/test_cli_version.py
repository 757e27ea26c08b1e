"""``icl --version``: the installed package's version, and the image's git revision when stamped."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from icl.cli import main


def _version_output(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out.strip()


def test_version_is_the_installed_package_version(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ICL_REVISION", raising=False)
    assert _version_output(capsys) == f"icl {version('kube-icl')}"


def test_version_names_the_revision_the_image_build_stamped(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ICL_REVISION", "0123abc\n")
    assert _version_output(capsys) == f"icl {version('kube-icl')} (revision 0123abc)"


def test_blank_revision_is_left_out(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ICL_REVISION", "  ")
    assert _version_output(capsys) == f"icl {version('kube-icl')}"
