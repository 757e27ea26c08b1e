"""Fixtures of the e2e tests: one real control plane per test session.

``control_plane`` (session) yields a started :class:`~.harness.ControlPlane`;
``namespace`` (per test) a fresh namespace whose pods are deleted afterwards.
Without the built binaries every e2e test skips with one line saying how to
build them; with ``ICL_E2E_REQUIRED=1`` (CI) that skip is a failure.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from .harness import NOT_BUILT, ControlPlane, require_binaries

_ACTIVE: list[ControlPlane] = []


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd, kube-apiserver, a plain kube-scheduler and kwok, ready; all stopped at the end."""
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"), require_binaries())
    plane.start()
    _ACTIVE.append(plane)
    try:
        yield plane
    finally:
        _ACTIVE.remove(plane)
        survivors = plane.stop()
    if survivors:
        pytest.fail(f"control plane processes survived teardown: {', '.join(survivors)}", pytrace=False)


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace; its pods are force-deleted after the test."""
    with control_plane.scratch_namespace("e2e") as name:
        yield name


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On a failed test that uses the control plane, add each component's log tail to its report."""
    report = yield
    if report.skipped and isinstance(report.longrepr, tuple) and NOT_BUILT in report.longrepr[2]:
        # One summary line for all e2e tests, not one per test.
        report.longrepr = (__file__, 0, report.longrepr[2])
    if report.failed and _ACTIVE and "control_plane" in getattr(item, "fixturenames", ()):
        for plane in _ACTIVE:
            for name, tail in plane.log_tails().items():
                report.sections.append((f"{name} log ({call.when})", tail))
    return report
