"""bench.placement_sharing's report: a class with no requests (a fleet without best-effort
models, or a pool with none) is shown as such, never a crash on its missing attainment."""

from __future__ import annotations

from bench.placement_sharing import markdown


def attained(good: int, offered: int) -> dict:
    return {"offered": offered, "good": good, "attainment": good / offered if offered else None,
            "worst_model": None if not offered else round(good / offered, 4)}


def test_a_fleet_without_best_effort_models_reports_no_best_effort_requests():
    planner = {"seed": 17, "models": 4, "best_effort_models": 0, "pool_gpus": 4, "guaranteed_only_gpus": 3,
               "methods": {"greedy": {"without_split": {"gpus": 3, "cost_per_hour": 9.0, "solve_s": 0.1, "method": "greedy"},
                                      "with_split": {"gpus": 3, "cost_per_hour": 9.0, "solve_s": 0.1, "method": "greedy"},
                                      "gpus_saved": 0, "saved_fraction": 0.0}},
               "overfull": [{"step": 0.0, "pool_gpus": 3, "without_split": "planned", "gpus": 3, "solve_s": 0.1,
                             "partial": False, "short_models": 0, "guaranteed_rps": 60.0, "guaranteed_placed_rps": 60.0,
                             "best_effort_rps": 0.0, "best_effort_placed_rps": 0.0, "example_shortfall": None}]}
    row = {"gpus": 3, "partial": False, "poisson": {"guaranteed": attained(190, 190), "best_effort": attained(0, 0)},
           "gamma": {"guaranteed": attained(189, 190), "best_effort": attained(0, 0)}}
    sim = {"seed": 17, "models": 4, "best_effort_models": 0, "rate_scale": 0.1, "total_rate": 60.0, "pool_gpus": 4,
           "duration_s": 3.0, "plans": {"with_split": row}}
    text = markdown(planner, sim, {"command": "python -m bench.placement_sharing", "machine": "test"})
    assert "| with split | 3 | poisson | 100.00% (1.0) | - (no requests) |" in text
    assert "0 of 0 req/s (-)" in text
