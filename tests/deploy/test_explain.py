"""``headrace explain``: fields with types, defaults, bounds and descriptions, read from the
models that validate; ``--schema`` is JSON Schema that accepts the shipped examples."""

from __future__ import annotations

import json
import operator
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.cli import main
from gateway.policy.config import SchedulerConfig
from profiles.schema import KINDS, json_schema

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "deploy/examples/quickstart").glob("*.yaml")) + sorted((ROOT / "placement/examples").glob("*.yaml"))


def explain(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["explain", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def violations(schema: dict[str, Any], value: Any, root: dict[str, Any], path: str = "$") -> list[str]:
    """What ``value`` breaks of ``schema`` (the JSON Schema subset pydantic emits); [] if valid."""
    if "$ref" in schema:
        return violations(root["$defs"][schema["$ref"].rsplit("/", 1)[1]], value, root, path)
    if "anyOf" in schema:
        tries = [violations(s, value, root, path) for s in schema["anyOf"]]
        return [] if [] in tries else min(tries, key=len)
    types = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float),
             "boolean": bool, "null": type(None)}
    t = schema.get("type")
    if t and (not isinstance(value, types[t]) or (isinstance(value, bool) and t in ("integer", "number"))):
        return [f"{path}: expected {t}, got {value!r}"]
    out = []
    if "const" in schema and value != schema["const"]:
        out.append(f"{path}: expected {schema['const']!r}, got {value!r}")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r} not in {schema['enum']}")
    for key, ok in (("minimum", operator.ge), ("maximum", operator.le), ("exclusiveMinimum", operator.gt),
                    ("exclusiveMaximum", operator.lt), ("minLength", lambda v, n: len(v) >= n),
                    ("maxLength", lambda v, n: len(v) <= n), ("minItems", lambda v, n: len(v) >= n),
                    ("maxItems", lambda v, n: len(v) <= n), ("pattern", lambda v, p: re.search(p, v))):
        if key in schema and not ok(value, schema[key]):
            out.append(f"{path}: {value!r} breaks {key} {schema[key]!r}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        out += [f"{path}.{k}: required" for k in schema.get("required", []) if k not in value]
        for k, v in value.items():
            sub = props.get(k, schema.get("additionalProperties", {}))
            out += [f"{path}.{k}: not allowed"] if sub is False else violations(sub, v, root, f"{path}.{k}")
    if isinstance(value, list) and "items" in schema:
        out += [x for i, v in enumerate(value) for x in violations(schema["items"], v, root, f"{path}[{i}]")]
    return out


def test_a_kind_lists_its_fields_with_type_default_bounds_and_description(capsys) -> None:
    rc, out, _ = explain(capsys, "ModelDeployment.spec")
    assert rc == 0
    assert "FIELD:    spec <ModelDeploymentSpec>  required" in out
    assert "  slo_ms <float>  required; gt 0, le 600000\n      latency objective per request, ms\n" in out
    assert "  source <Literal['emulated','digits','artifact']>  default 'emulated'\n" in out
    assert "  variants <list[str | VariantSpec]>  default []; max_length 64\n" in out
    assert "  accuracy_floor <float | None>  default None; ge 0, le 1\n" in out
    # NOTE: every field of the model is listed, in declaration order
    listed = re.findall(r"^  (\w+) <", out, re.M)
    assert listed == list(KINDS["ModelDeployment"].model_fields["spec"].annotation.model_fields)


def test_a_path_field_says_it_is_a_file_path(capsys) -> None:
    rc, out, _ = explain(capsys, "ModelDeployment.spec.variants")
    assert rc == 0 and "  profile <str | None>  default None; a file path\n" in out
    assert "  name <str>  required; min_length 1, max_length 200\n" in out  # not a path


def test_a_kind_shows_its_summary_and_top_level_fields(capsys) -> None:
    rc, out, _ = explain(capsys, "GpuPool")
    assert rc == 0 and out.startswith("KIND:     GpuPool\n")
    assert "  apiVersion <Literal['headrace.dev/v1']>  default 'headrace.dev/v1'\n" in out
    assert "  spec <GpuPoolSpec>  required\n" in out


def test_a_nested_path_explains_one_field_and_the_object_it_holds(capsys) -> None:
    rc, out, _ = explain(capsys, "ModelDeployment.spec.autoscaling.max_replicas")
    assert rc == 0
    assert "FIELD:    spec.autoscaling.max_replicas <int | None>  default None; ge 1, le 10000\n" in out
    assert "most replicas (None: the pool)" in out and "FIELDS" not in out
    rc, out, _ = explain(capsys, "GpuPool.spec.nodes.gpus")  # through list[...]
    assert rc == 0 and "FIELDS (GpuGroup):" in out and "  count <int>  required; ge 1, le 10000\n" in out
    rc, out, _ = explain(capsys, "gpupool.metadata.name")  # kinds are case-insensitive
    assert rc == 0 and "pattern '^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$'" in out


def test_scheduler_explains_the_gateways_scheduler_config(capsys) -> None:
    rc, alias, _ = explain(capsys, "Scheduler")
    assert rc == 0 and "FIELDS (SchedulerConfig):" in alias
    assert re.findall(r"^  (\w+) <", alias, re.M) == list(SchedulerConfig.model_fields)
    assert "  quantile <Literal['p50','p99']>  default 'p99'\n" in alias
    assert "  queue_timeout_s <float | None>  default None; gt 0, le 600\n" in alias
    for path in ("Gateway.spec.scheduler", "Gateway.scheduler"):  # spec is implied
        rc, out, _ = explain(capsys, path)
        assert rc == 0 and "FIELD:    spec.scheduler <SchedulerConfig>" in out
        assert out.split("FIELDS")[1] == alias.split("FIELDS")[1]


def test_no_argument_lists_the_kinds_one_line_each(capsys) -> None:
    rc, out, _ = explain(capsys)
    assert rc == 0
    starts = [line.split()[0] for line in out.splitlines() if line and not line.startswith("headrace")]
    assert starts == [*KINDS, "Scheduler"]


@pytest.mark.parametrize(("args", "want"), [
    (("ModelDeployment.spec.slo",), "ModelDeployment.spec has no field 'slo'; known: model, rate, slo_ms,"),
    (("Deployment",), "unknown kind 'Deployment'; known: GpuPool, ModelDeployment, Gateway, Scheduler"),
    (("ModelDeployment.spec.rate.max",), "ModelDeployment.spec.rate (float) has no fields"),
    (("GpuPool.spec", "--schema"), "--schema takes a kind, not a field (GpuPool.spec)"),
])
def test_an_unknown_kind_or_field_is_one_line_and_exit_2(capsys, args: tuple[str, ...], want: str) -> None:
    rc, out, err = explain(capsys, *args)
    assert rc == 2 and out == ""
    assert err.splitlines() == [err.strip()] and err.startswith(f"headrace explain: {want}")


@pytest.mark.parametrize("kind", [*KINDS, "Scheduler"])
def test_schema_is_json_with_the_kinds_fields(capsys, kind: str) -> None:
    rc, out, _ = explain(capsys, kind, "--schema")
    assert rc == 0
    model = SchedulerConfig if kind == "Scheduler" else KINDS[kind]
    assert list(json.loads(out)["properties"]) == list(model.model_fields)


def test_every_example_document_validates_against_its_kinds_schema() -> None:
    seen = set()
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            schema = json_schema(doc["kind"])
            assert violations(schema, doc, schema) == [], path
            seen.add(doc["kind"])
    assert seen == set(KINDS)


@pytest.mark.parametrize(("kind", "doc", "want"), [
    ("ModelDeployment", {"metadata": {"name": "m"}, "spec": {"model": "m", "rate": 1, "slo_msec": 5}},
     ["$.spec.slo_ms: required", "$.spec.slo_msec: not allowed"]),
    ("ModelDeployment", {"metadata": {"name": "m"}, "spec": {"model": "m", "rate": -1, "slo_ms": 0}},
     ["$.spec.rate: -1 breaks minimum 0", "$.spec.slo_ms: 0 breaks exclusiveMinimum 0"]),
    ("GpuPool", {"apiVersion": "headrace.dev/v2", "metadata": {"name": "Bad_Name"}, "spec": {"nodes": []}},
     ["$.apiVersion: expected 'headrace.dev/v1', got 'headrace.dev/v2'",
      "$.metadata.name: 'Bad_Name' breaks pattern '^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$'",
      "$.spec.nodes: [] breaks minItems 1"]),
])
def test_the_schema_check_rejects_what_validation_rejects(kind: str, doc: dict, want: list[str]) -> None:
    # NOTE: guards the hand-written checker above: a check that accepts everything proves nothing
    schema = json_schema(kind)
    assert violations(schema, doc, schema) == want


def test_the_committed_schemas_are_current(tmp_path: Path, capsys) -> None:
    assert main(["explain", "--schema-dir", str(tmp_path)]) == 0
    written = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert sorted(written) == sorted(f"{k}.schema.json" for k in KINDS)
    for name, text in written.items():
        assert (ROOT / "docs/schema" / name).read_text() == text, \
            f"docs/schema/{name} is stale: headrace explain --schema-dir docs/schema"
