"""The Kubernetes executor: manifests that validate against the bundled Kubernetes schemas,
operator configs per node, resource names, and a re-plan in make-before-break order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from placement.apply.kubernetes import (
    KubernetesError,
    Options,
    k8s_name,
    mig_parted_configs,
    render,
)
from placement.diff import diff
from placement.plan import GpuPlan, SlicePlan
from tests.placement.test_executors import _plan, _rep

jsonschema = pytest.importorskip("jsonschema")
SCHEMAS = Path(__file__).parents[2] / "placement" / "schemas" / "k8s"
SCHEMA_FILES = {"Deployment": "deployment-apps-v1.json", "Service": "service-v1.json", "ConfigMap": "configmap-v1.json"}


def validate(doc: dict) -> None:
    schema = json.loads((SCHEMAS / SCHEMA_FILES[doc["kind"]]).read_text())
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    cls(schema).validate(doc)


def fleet():
    return _plan((
        GpuPlan("n0/gpu0", "A100-80GB", True, (SlicePlan("3g.40gb", 4, False, (_rep("a"),)),
                                               SlicePlan("1g.10gb", 0, False, (_rep("b"),)))),
        GpuPlan("n1/gpu1", "A100-80GB", False, (SlicePlan("gpu", None, True, (_rep("a", .5), _rep("c", .5))),)),
    ))


def test_rendered_manifests_validate_against_the_kubernetes_schemas():
    m = render(fleet(), fleet().profiles)
    text = m.to_yaml("headrace")
    docs = list(yaml.safe_load_all(text))
    assert [d["kind"] for d in docs] == ["ConfigMap", "ConfigMap"] + ["Deployment", "Service"] * 4 + ["ConfigMap"]
    for d in docs:
        validate(d)
    # NOTE: the bundled schemas are strict: a misspelt field fails (the check can fail)
    bad = json.loads(json.dumps(docs[2]))
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    assert "kubectl label node n0 nvidia.com/mig.config=headrace-n0 --overwrite" in text


def test_replicas_ask_for_their_slice_as_the_device_plugin_names_it():
    docs = render(fleet(), fleet().profiles).apply
    deps = {d["metadata"]["annotations"]["headrace.dev/replica-id"]: d for d in docs if d["kind"] == "Deployment"}
    c = deps["n0/gpu0/3g.40gb@4/a"]["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"] == {"nvidia.com/mig-3g.40gb": 1}
    assert c["image"] == "nvcr.io/nvidia/tritonserver:24.08-py3" and "--load-model=a" in c["args"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert deps["n0/gpu0/3g.40gb@4/a"]["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "n0"}
    mps = deps["n1/gpu1/gpu/c"]["spec"]["template"]["spec"]["containers"][0]
    assert mps["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert mps["env"] == [{"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "50"}]
    plugin = yaml.safe_load(docs[1]["data"]["headrace-n1"])
    assert plugin["sharing"]["mps"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 2}]
    assert "sharing" not in yaml.safe_load(docs[1]["data"]["headrace-n0"])
    assert mig_parted_configs(fleet())["n0"] == {"version": "v1", "mig-configs": {"headrace-n0": [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 1, "3g.40gb": 1}}]}}


def test_the_gateway_config_points_at_the_services():
    docs = render(fleet(), fleet().profiles).apply
    gw = docs[-1]
    cfg = yaml.safe_load(gw["data"]["gateway.yaml"])
    urls = {r["id"]: r["url"] for m in cfg["models"] for r in m["replicas"]}
    assert urls["n0/gpu0/3g.40gb@4/a"] == f"{k8s_name('n0/gpu0/3g.40gb@4/a')}.headrace.svc.cluster.local:8000"
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    assert {u.split(".")[0] for u in urls.values()} == services
    # every profile the config names is in the ConfigMap
    assert all(r["profile"].rsplit("/", 1)[1] in gw["data"] for m in cfg["models"] for r in m["replicas"])


def test_a_replan_renders_creations_before_deletions():
    old = fleet()
    new = _plan((old.gpus[0], GpuPlan("n1/gpu1", "A100-80GB", False,
                                      (SlicePlan("gpu", None, False, (_rep("c"),)),)), ))
    m = render(diff(old, new), new.profiles)
    text = m.to_yaml("headrace")
    assert [d["kind"] for d in m.apply] == ["ConfigMap", "ConfigMap", "Deployment", "Service", "ConfigMap"]
    assert text.index("kind: Deployment") < text.index("kubectl delete -n headrace deployment/")
    assert m.delete == (("Deployment", k8s_name("n1/gpu1/gpu/a")), ("Service", k8s_name("n1/gpu1/gpu/a")),
                        ("Deployment", k8s_name("n1/gpu1/gpu/c")), ("Service", k8s_name("n1/gpu1/gpu/c")))


def test_plans_the_device_plugin_cannot_serve_are_refused_with_the_reason():
    mig_mps = _plan((GpuPlan("n0/gpu0", "A100-80GB", True,
                             (SlicePlan("1g.10gb", 0, True, (_rep("a", .5), _rep("b", .5))),)),))
    with pytest.raises(KubernetesError, match="MPS on a MIG device"):
        render(mig_mps, mig_mps.profiles)
    uneven = _plan((GpuPlan("n0/gpu0", "A100-80GB", False,
                            (SlicePlan("gpu", None, True, (_rep("a", .75), _rep("b", .25))),)),))
    with pytest.raises(KubernetesError, match="75% MPS share does not fit one of the 2 equal parts"):
        render(uneven, uneven.profiles)
    assert len(k8s_name("n0/" + "x" * 100)) <= 63 and k8s_name("N0/GPU1/1g.10gb@0/a#2") == "hr-n0-gpu1-1g-10gb-0-a-2"


def test_options_change_namespace_image_and_repository():
    opts = Options(namespace="serving", image_tag="24.12", model_repository="s3://bucket/models")
    docs = render(fleet(), fleet().profiles, opts).apply
    dep = next(d for d in docs if d["kind"] == "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert dep["metadata"]["namespace"] == "serving" and c["image"].endswith(":24.12-py3")
    assert "--model-repository=s3://bucket/models" in c["args"] and "volumes" not in dep["spec"]["template"]["spec"]
    validate(dep)


def test_render_k8s_prints_the_manifests_of_a_planned_pool(tmp_path, capsys):
    from deploy.cli import main

    pool = tmp_path / "pool.yaml"
    pool.write_text("apiVersion: headrace.dev/v1\nkind: GpuPool\nmetadata: {name: lab}\nspec:\n  nodes:\n"
                    "    - {name: node0, gpus: [{model: A100-80GB, count: 4, mps: false}]}\n"
                    "    - {name: node1, gpus: [{model: H100-80GB, count: 2, mps: false}]}\n")
    assert main(["render-k8s", "-f", str(pool), "-f", "placement/examples/models.yaml", "--namespace", "x"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    for d in docs:
        validate(d)
    assert {d["metadata"]["namespace"] for d in docs if d["kind"] == "Deployment"} == {"x"}
    assert main(["render-k8s", "-f", "placement/examples/pool.yaml", "-f", "placement/examples/models.yaml"]) == 2
    assert "mps: false" in capsys.readouterr().err
