"""Bad operator documents: ``headrace plan -f`` answers each with one line on stderr, naming
the file, the document, the field path and the value given, and exit code 2."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

from deploy.cli import main

POOL = """apiVersion: headrace.dev/v1
kind: GpuPool
metadata: {name: lab}
spec:
  nodes:
    - name: node0
      gpus:
        - {model: A100-80GB, count: 1}
"""


def deployment(spec: str, *, name: str = "m", kind: str = "ModelDeployment",
               api: str = "headrace.dev/v1") -> str:
    return f"apiVersion: {api}\nkind: {kind}\nmetadata: {{name: {name}}}\nspec: {spec}\n"


RESNET = deployment("{model: resnet50, rate: 10, slo_ms: 100}", name="resnet50")


def profile(variant: str, gpu: str, slice_: str) -> str:
    """A small profile document in the format ``headrace profile`` writes."""
    return f"""apiVersion: headrace.dev/v1
kind: Profile
metadata: {{name: {variant}@{gpu}/{slice_}}}
spec:
  model: resnet50
  variant: {variant}
  gpu: {gpu}
  slice: {slice_}
  max_batch: 8
  latency_ms:
  - {{batch: 1, p50: 1.0, p99: 2.0}}
  - {{batch: 8, p50: 4.0, p99: 6.0}}
  provenance: {{source: hand-written, kind: measured}}
"""


class Case(NamedTuple):
    files: dict[str, str]  # name -> text, written to the test's folder
    expect: tuple[str, ...]  # substrings of the one error line; {d} is the folder
    plan: tuple[str, ...] = ("pool.yaml", "models.yaml")  # the -f files, in order


CASES = {
    # the second document of the file is the bad one: the index counts
    "unknown-model": Case(
        {"pool.yaml": POOL, "models.yaml": RESNET + "---\n" + deployment("{model: nosuch, rate: 10, slo_ms: 100}")},
        ("{d}/models.yaml document 1: spec.model: no profiles for model 'nosuch'", "(got 'nosuch')")),
    "unknown-variant": Case(
        {"pool.yaml": POOL,
         "models.yaml": deployment("{model: resnet50, rate: 10, slo_ms: 100, variants: [resnet50, resnet50-int3]}")},
        ("{d}/models.yaml document 0: spec.variants.1: model 'resnet50' has no variant 'resnet50-int3'",
         "(got 'resnet50-int3')")),
    "profile-names-unknown-gpu": Case(
        {"pool.yaml": POOL, "b200.yaml": profile("resnet50-b", "B300", "gpu"),
         "models.yaml": deployment("{model: resnet50, rate: 10, slo_ms: 100, "
                                   "variants: [resnet50, {name: resnet50-b, profile: b200.yaml}]}")},
        ("{d}/models.yaml document 0: spec.variants.1.profile: {d}/b200.yaml document 0: spec.gpu: "
         "unknown GPU model 'B300'", "(got 'B300')")),
    "profile-names-unknown-slice": Case(
        {"pool.yaml": POOL, "slice.yaml": profile("resnet50-b", "A100-80GB", "5g.50gb"),
         "models.yaml": deployment("{model: resnet50, rate: 10, slo_ms: 100, "
                                   "variants: [{name: resnet50-b, profile: slice.yaml}]}")},
        ("{d}/models.yaml document 0: spec.variants.0.profile: {d}/slice.yaml document 0: spec.slice: "
         "A100-80GB has no MIG profile '5g.50gb'", "(got '5g.50gb')")),
    "profile-file-missing": Case(
        {"pool.yaml": POOL, "models.yaml": deployment("{model: resnet50, rate: 10, slo_ms: 100, "
                                                      "variants: [{name: resnet50, profile: nope.yaml}]}")},
        ("{d}/models.yaml document 0: spec.variants.0.profile: ", "cannot read", "(got 'nope.yaml')")),
    "wrong-kind": Case(
        {"pool.yaml": POOL, "models.yaml": RESNET + "---\n" + deployment("{}", kind="ModelDeploy")},
        ("{d}/models.yaml document 1: kind: must be one of GpuPool, ModelDeployment, Gateway",
         "(got 'ModelDeploy')")),
    "wrong-api-version": Case(
        {"pool.yaml": POOL,
         "models.yaml": deployment("{model: resnet50, rate: 10, slo_ms: 100}", api="headrace.dev/v2")},
        ("{d}/models.yaml document 0: apiVersion: ", "'headrace.dev/v1'", "(got 'headrace.dev/v2')")),
    "negative-rate": Case(
        {"pool.yaml": POOL, "models.yaml": deployment("{model: resnet50, rate: -5, slo_ms: 100}")},
        ("{d}/models.yaml document 0: spec.rate: Input should be greater than or equal to 0 (got -5)",)),
    "rate-not-a-number": Case(
        {"pool.yaml": POOL, "models.yaml": deployment("{model: resnet50, rate: fast, slo_ms: 100}")},
        ("{d}/models.yaml document 0: spec.rate: Input should be a valid number", "(got 'fast')")),
    "unknown-field": Case(
        {"pool.yaml": POOL, "models.yaml": deployment("{model: resnet50, rate: 10, slo_msec: 100}")},
        ("{d}/models.yaml document 0: ", "spec.slo_ms: Field required;",
         "spec.slo_msec: Extra inputs are not permitted (got 100)")),
    "gpu-not-in-catalogue": Case(
        {"pool.yaml": POOL + "        - {model: A100-90GB, count: 2}\n", "models.yaml": RESNET},
        ("{d}/pool.yaml document 0: spec.nodes.0.gpus.1.model: model ('A100-90GB') is not a known GPU",
         "(got 'A100-90GB')")),
    # NOTE: a stream that does not parse has no documents: the line names the file and the position
    "malformed-yaml": Case(
        {"pool.yaml": POOL, "models.yaml": "apiVersion: headrace.dev/v1\nkind: ModelDeployment\n"
                                           "metadata: {name: m}\nspec: {model: resnet50, rate: 10\n"},
        ("{d}/models.yaml: line 5, column 1: not valid YAML: expected ',' or '}'",
         "while parsing a flow mapping at line 4")),
    "artifact-source-without-artifact": Case(
        {"pool.yaml": POOL,
         "models.yaml": deployment("{model: resnet50, rate: 10, slo_ms: 100, source: artifact, variants: [resnet50]}")},
        ("{d}/models.yaml document 0: spec: source 'artifact' needs an artifact for every variant; "
         "missing for ['resnet50']",)),
    "artifact-remote-uri": Case(
        {"pool.yaml": POOL,
         "models.yaml": deployment("{model: resnet50, rate: 10, slo_ms: 100, source: artifact, "
                                   "variants: [{name: resnet50, artifact: {uri: 's3://b/m'}}]}")},
        ("{d}/models.yaml document 0: spec.variants.0.artifact.uri: uri 's3://b/m': only local paths",
         "(got 's3://b/m')")),
    "duplicate-model": Case(
        {"pool.yaml": POOL, "models.yaml": RESNET + "---\n" + deployment("{model: resnet50, rate: 20, slo_ms: 50}")},
        ("{d}/models.yaml document 1: spec.model: one ModelDeployment per model; "
         "'resnet50' is also in {d}/models.yaml document 0 (got 'resnet50')",)),
    "max-replicas-below-min": Case(
        {"pool.yaml": POOL, "models.yaml": deployment("{model: resnet50, rate: 10, slo_ms: 100, "
                                                      "autoscaling: {min_replicas: 4, max_replicas: 2}}")},
        ("{d}/models.yaml document 0: spec.autoscaling: max_replicas (2) is below min_replicas (4)",)),
    "bad-metadata-name": Case(
        {"pool.yaml": POOL, "models.yaml": deployment("{model: resnet50, rate: 10, slo_ms: 100}", name="Res_Net")},
        ("{d}/models.yaml document 0: metadata.name: String should match pattern", "(got 'Res_Net')")),
}


@pytest.mark.parametrize("command", ["plan", "up", "apply"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_bad_document_is_one_line_naming_file_document_field_and_value(case: Case, command: str, tmp_path: Path,
                                                                         capsys) -> None:
    d = tmp_path.resolve()
    for name, text in case.files.items():
        (d / name).write_text(text)
    # up and apply validate before they start or call anything (no controller runs here)
    state = ["--state-dir", str(d / "state")] if command != "plan" else []
    rc = main([command, *state, *(arg for f in case.plan for arg in ("-f", str(d / f)))])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"headrace {command}: "), lines[0]
    assert not (d / "state" / "state.json").exists()  # nothing was started
    for want in case.expect:
        assert want.replace("{d}", str(d)) in lines[0], lines[0]


def test_the_examples_still_plan(capsys) -> None:
    assert main(["plan", "-f", "deploy/examples/quickstart/", "--output", "yaml"]) == 0
    assert "kind: Plan" in capsys.readouterr().out


def test_a_field_whose_name_starts_like_a_union_tag_is_still_named() -> None:
    from pydantic import BaseModel, ValidationError

    from profiles.schema import format_error

    class M(BaseModel):
        stream_timeout_s: float
        strategy: str

    try:
        M.model_validate({"stream_timeout_s": "x", "strategy": [1]})
    except ValidationError as e:
        msg = format_error(e, "f.yaml")
    assert "stream_timeout_s: " in msg and "strategy: " in msg and "str:" not in msg, msg
