"""Shared test settings: hypothesis profiles (``ci`` is thorough and deterministic); ``restore_logging``."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile(
    "ci", max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)

settings.register_profile("stress", max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """The root logger's handlers and level as they were before the test (a CLI's main sets them up)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(autouse=True)
def _named_logger_levels() -> Iterator[None]:
    """Every named logger's level as it was before the test (NOTSET for one the test made): a CLI's main
    run in process (``kubectl icl`` quiets the extender's loggers) must not change the next test's logs."""
    manager = logging.root.manager
    levels = {name: lg.level for name, lg in manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    yield
    for name, lg in list(manager.loggerDict.items()):
        if isinstance(lg, logging.Logger):
            lg.setLevel(levels.get(name, logging.NOTSET))
