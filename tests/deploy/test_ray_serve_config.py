"""``headrace render-serve``: a Serve config Ray's own schema accepts, whose deployments carry the
custom resources ``headrace up --ray`` gives its actors, and whose application builds."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytest.importorskip("ray.serve")

from deploy.cli import main  # noqa: E402
from tests.operator_harness import deployment  # noqa: E402
from tests.ray_harness import ray_pool, write  # noqa: E402


def rendered(tmp_path: Path, rate: float) -> dict:
    docs = write(tmp_path / "d.yaml", ray_pool(), deployment("resnet50", rate, 100))
    out = tmp_path / "serve.yaml"
    assert main(["render-serve", "-f", str(docs), "-o", str(out)]) == 0
    return yaml.safe_load(out.read_text())


def test_the_serve_config_validates_against_rays_schema_with_the_plans_resources(tmp_path: Path) -> None:
    from ray.serve.schema import ServeDeploySchema

    cfg = rendered(tmp_path, 3500)
    ServeDeploySchema.model_validate(cfg)  # raises on a config `serve deploy` would refuse
    deps = {d["name"]: d["ray_actor_options"]["resources"] for d in cfg["applications"][0]["deployments"]}
    # NOTE: two whole A100s on n2 (first in the pool): each arbiter holds one, each Triton is pinned beside it
    assert deps == {
        "gpu-n2-gpu0": {"headrace-node:n2": 0.001, "A100-80GB": 1.0},
        "triton-n2-gpu0-gpu-resnet50": {"headrace-node:n2": 0.001},
        "gpu-n2-gpu1": {"headrace-node:n2": 0.001, "A100-80GB": 1.0},
        "triton-n2-gpu1-gpu-resnet50": {"headrace-node:n2": 0.001},
        "gateway": {"node:__internal_head__": 0.001},
    }
    assert cfg["proxy_location"] == "Disabled"  # requests reach the gateway's own ports


def test_the_application_builds_from_the_configs_arguments(tmp_path: Path) -> None:
    from ray.serve import Application

    from deploy.ray.serve_app import build

    cfg = rendered(tmp_path, 3500)
    assert isinstance(build(cfg["applications"][0]["args"]), Application)


def test_a_demand_the_pool_cannot_hold_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    docs = write(tmp_path / "d.yaml", ray_pool(), deployment("resnet50", 50_000, 100))
    assert main(["render-serve", "-f", str(docs)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("headrace render-serve: ") and err.count("\n") == 1 and "does not fit" in err, err
