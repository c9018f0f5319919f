"""Every token-level router by name: headrace's and the baselines, built fresh."""

from __future__ import annotations

from gateway.policy.llm.baselines import BASELINES
from gateway.policy.llm.baselines import make as make_baseline
from gateway.policy.llm.flow import FlowSettings
from gateway.policy.llm.router import RouterSettings, SloRouter
from gateway.policy.llm.types import RouterBase

HEADRACE = "headrace"
NAMES: tuple[str, ...] = (HEADRACE, *BASELINES)


def make(name: str, seed: int = 0, flow: FlowSettings | None = None) -> RouterBase:
    """A fresh router: headrace's (holding requests by ``flow``) or a baseline (drawing with
    ``seed``); ValueError listing the known names."""
    if name == HEADRACE:
        return SloRouter(RouterSettings(flow=flow or FlowSettings()))
    if name not in BASELINES:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(NAMES)}")
    return make_baseline(name, seed)
