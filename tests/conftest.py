"""Shared test options: slow (soak/benchmark-style) tests are opt-in with --run-slow."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# CI runs the same generated examples every time (a red CI is reproducible); local runs explore.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False, help="run tests marked slow")
    parser.addoption("--run-ray", action="store_true", default=False,
                     help="run the tests on a local Ray cluster (marked ray; .ci/run runs them as a second step)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ray: starts a local multi-node Ray cluster; opt-in with --run-ray")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--run-ray"):
        skip_ray = pytest.mark.skip(reason="ray: opt in with --run-ray")
        for item in items:
            if item.get_closest_marker("ray") is not None:
                item.add_marker(skip_ray)
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: opt in with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
