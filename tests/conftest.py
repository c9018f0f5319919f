"""Shared test options: slow (soak/benchmark-style) tests are opt-in with --run-slow, the local Ray
cluster's with --run-ray, and real vLLM on CPU's with --run-vllm."""

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
    parser.addoption("--run-vllm", action="store_true", default=False,
                     help="run the tests against real vLLM on CPU (marked vllm; needs bench/vllm_cpu/install.sh)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ray: starts a local multi-node Ray cluster; opt-in with --run-ray")
    config.addinivalue_line("markers", "vllm: starts real vLLM on CPU (bench/vllm_cpu); opt-in with --run-vllm")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--run-ray"):
        skip_ray = pytest.mark.skip(reason="ray: opt in with --run-ray")
        for item in items:
            if item.get_closest_marker("ray") is not None:
                item.add_marker(skip_ray)
    if not config.getoption("--run-vllm"):
        skip_vllm = pytest.mark.skip(reason="vllm: opt in with --run-vllm")
        for item in items:
            if item.get_closest_marker("vllm") is not None:
                item.add_marker(skip_vllm)
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: opt in with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
