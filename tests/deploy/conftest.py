"""Starts the wheel test's build and install in the background once collection shows it will run."""

from __future__ import annotations

import os

import pytest

from tests.deploy import prebuild


def pytest_collection_finish(session: pytest.Session) -> None:
    # Under pytest-xdist every worker collects every test: there the fixtures start the build on demand.
    if "PYTEST_XDIST_WORKER" in os.environ:
        return
    if any(item.path.name == "test_wheel_install.py" for item in session.items):
        prebuild.prepared()


def pytest_sessionfinish(session: pytest.Session) -> None:
    prebuild.close()
