"""Every benchmark's markdown is a function of its committed JSON: each renderer, run on
``bench/results/<name>.json``, gives the committed ``<name>.md`` byte for byte. So a table in
the docs can be regenerated, and a change to a renderer shows up here before a re-run.

``sim_speed.before.json`` is the earlier run ``bench.sim_speed --baseline`` reads; it has no
markdown of its own.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def _one(fn: str) -> Callable[[Any, dict], str]:
    return lambda mod, r: getattr(mod, fn)(r)


RENDERERS: dict[str, tuple[str, Callable[[Any, dict], str]]] = {
    "admission_tradeoff": ("admission_tradeoff", _one("markdown")),
    "capacity_check": ("capacity_check", _one("markdown")),
    "emulator_fidelity": ("emulator_fidelity", _one("markdown")),
    "fleet_study": ("fleet_study", _one("markdown")),
    "gateway_overhead": ("gateway_overhead", _one("markdown")),
    "gateway_scaleout": ("gateway_scaleout", _one("markdown")),
    "gateway_slo": ("gateway_slo", _one("markdown")),
    "isolation": ("isolation", _one("render")),
    "isolation_cost": ("isolation_cost", _one("render")),
    "llm_engine_fidelity": ("llm_engine_fidelity", _one("markdown")),
    "llm_traces": ("llm_traces", _one("markdown")),
    "llm_frontdoor": ("llm_frontdoor", _one("markdown")),
    "llm_routing": ("llm_routing", _one("markdown")),
    "llm_routing_live": ("llm_routing_live", _one("markdown")),
    "llm_sim_speed": ("llm_sim_speed", _one("render")),
    "loadgen_capacity": ("loadgen_capacity", _one("markdown")),
    "placement_capacity": ("placement_capacity", _one("markdown")),
    "placement_sharing": ("placement_sharing", lambda m, r: m.markdown(r["planner"], r["sim"], r["meta"])),
    "placement_solver": ("placement_solver",
                         lambda m, r: m.markdown(r["rows"], r["meta"], r["other_seeds"], r["accuracy"], r["fleet"])),
    "placement_solver_fleet": ("placement_solver", _one("fleet_only_markdown")),
    "policy_study": ("policy_study", _one("markdown")),
    "ray_scaleout": ("ray_scaleout", _one("report")),
    "refusal_latency": ("refusal_latency", _one("markdown")),
    "replan": ("replan", _one("render")),
    "sim_fidelity": ("sim_fidelity", _one("markdown")),
    "sim_speed": ("sim_speed", _one("markdown")),
    "sim_speed_hour": ("sim_speed", _one("markdown")),
    "variants": ("variants", _one("markdown")),
}
WITHOUT_MARKDOWN = {"sim_speed.before"}


def test_every_result_has_a_renderer() -> None:
    names = {p.stem for p in RESULTS.glob("*.json")}
    assert names - WITHOUT_MARKDOWN == set(RENDERERS)


@pytest.mark.parametrize("name", sorted(RENDERERS))
def test_the_markdown_regenerates_from_the_json(name: str) -> None:
    module, render = RENDERERS[name]
    result = json.loads((RESULTS / f"{name}.json").read_text())
    assert render(importlib.import_module(f"bench.{module}"), result) == (RESULTS / f"{name}.md").read_text()
