"""The operator's documents: read and parsed once per command, and every path field the schema
marks made absolute against its file's folder, found by walking the models."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import Field

from deploy.operator.client import CliError
from deploy.operator.controller import Controller
from deploy.operator.desired import validate
from deploy.operator.documents import resolve_documents, resolved_stream
from deploy.operator.state import DirStateStore
from profiles.schema import PATH, Documents, ModelDeployment, VariantSpec, is_path, json_schema
from tests.operator_harness import deployment, pool, write_docs


class NotedVariant(VariantSpec):
    """A variant whose schema gains a path field the operator has never heard of."""

    notes: str | None = Field(default=None, json_schema_extra=PATH, description="release notes file")


def test_a_path_field_added_only_in_the_schema_is_resolved(tmp_path: Path) -> None:
    md = ModelDeployment.model_validate(deployment("m", 1, 100))
    md.spec.variants = [NotedVariant(name="v", notes="notes/v.md", profile="~/v.yaml")]
    docs = Documents(deployments=[md], base_dir={id(md): tmp_path})
    resolve_documents(docs)
    (v,) = md.spec.variants
    assert v.notes == str(tmp_path / "notes/v.md")
    assert v.profile == str(Path.home() / "v.yaml")  # ~ is the home folder for every path field
    assert v.name == "v"  # a field the schema does not mark is left as given


def _marked(schema: dict[str, Any]) -> set[str]:
    """``Model.field`` of every field the JSON Schema marks as a path."""
    return {f"{name}.{field}" for name, model in schema.get("$defs", {}).items()
            for field, prop in model.get("properties", {}).items() if prop.get("path") is True}


def test_every_path_the_schema_marks_reaches_the_controller_absolute(tmp_path: Path) -> None:
    gateway = {"apiVersion": "headrace.dev/v1", "kind": "Gateway", "metadata": {"name": "gw"}, "spec": {
        "tls": {"cert_file": "certs/gw.pem", "key_file": "certs/gw.key", "client_ca_file": "certs/ca.pem"},
        "tenants": [{"name": "a", "keys": [{"file": "a.key"}, {"env": "A_KEY"}]}],
        "admin": {"tls": {"cert_file": "certs/admin.pem", "key_file": "certs/admin.key"}}}}
    model = deployment("m", 1, 100, source="artifact",
                       variants=[{"name": "v", "artifact": {"uri": "file://models/v"}, "profile": "v.yaml"}])
    docs = write_docs(tmp_path / "d.yaml", pool(), model, gateway)
    sent = {d["kind"]: d["spec"] for d in yaml.safe_load_all(resolved_stream([docs]))}
    gw, (v,) = sent["Gateway"], sent["ModelDeployment"]["variants"]
    assert gw["tls"] == {k: str(tmp_path / "certs" / f) for k, f in
                         (("cert_file", "gw.pem"), ("key_file", "gw.key"), ("client_ca_file", "ca.pem"))}
    assert gw["admin"]["tls"] == {"cert_file": str(tmp_path / "certs/admin.pem"),
                                  "key_file": str(tmp_path / "certs/admin.key")}
    assert gw["tenants"][0]["keys"] == [{"file": str(tmp_path / "a.key")}, {"env": "A_KEY"}]
    assert v == {"name": "v", "artifact": {"uri": f"file://{tmp_path}/models/v"}, "profile": str(tmp_path / "v.yaml")}
    # NOTE: the document above gives every field the schema marks, so none is missed here
    assert _marked(json_schema("Gateway")) | _marked(json_schema("ModelDeployment")) == {
        "CertificateSpec.cert_file", "CertificateSpec.key_file", "TlsSpec.cert_file", "TlsSpec.key_file",
        "TlsSpec.client_ca_file", "ApiKeySpec.file", "ArtifactSpec.uri", "VariantSpec.profile"}
    assert is_path(VariantSpec.model_fields["profile"]) and not is_path(VariantSpec.model_fields["name"])


class _Stop(Exception):
    """The runtime's first step: the command has done all its reading by then."""


class StopAtFirstStep:
    def run(self, step: object) -> None:
        raise _Stop

    def endpoints(self) -> dict:
        return {}


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every YAML stream of documents parsed from now on (``safe_load_all`` goes through ``load_all``)."""
    seen: list[str] = []
    load_all = yaml.load_all

    def spy(stream: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(stream, str) and "kind: ModelDeployment" in stream:
            seen.append(stream)
        return load_all(stream, *args, **kwargs)

    monkeypatch.setattr(yaml, "load_all", spy)
    return seen


def test_up_parses_its_documents_once(tmp_path: Path, parses: list[str]) -> None:
    docs = write_docs(tmp_path / "d.yaml", pool(), deployment("resnet50", 50, 100))
    _, want, base = validate([str(docs)], check_security=True)
    ctl = Controller(DirStateStore(tmp_path / "state"), base, runtime=StopAtFirstStep())  # type: ignore[arg-type]
    with pytest.raises(_Stop):
        asyncio.run(ctl.up(want))
    # NOTE: the command read its file once; the controller plans from what it validated
    assert len(parses) == 1 and (tmp_path / "state/generations/1.yaml").read_text() == want.text


def test_apply_parses_its_documents_once_before_sending_them(tmp_path: Path, parses: list[str]) -> None:
    docs = write_docs(tmp_path / "d.yaml", pool(), deployment("resnet50", 50, 100))
    text, want, _ = validate([str(docs)])
    assert len(parses) == 1 and text == want.text


def test_plan_and_sim_parse_their_documents_once(tmp_path: Path, parses: list[str]) -> None:
    from loadgen.sim.fleet import load_fleet
    from placement.problem import load

    docs = write_docs(tmp_path / "d.yaml", pool(), deployment("resnet50", 50, 100))
    load([str(docs)], [])  # headrace plan
    assert len(parses) == 1
    load_fleet([docs])  # headrace sim: which kind of file it is, then the plan, from one parse
    assert len(parses) == 2


def test_a_bad_scheduler_setting_fails_validation_naming_it(tmp_path: Path) -> None:
    gw = {"apiVersion": "headrace.dev/v1", "kind": "Gateway", "metadata": {"name": "gw"},
          "spec": {"listen": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0}, "scheduler": {"no_such": 1}}}
    docs = write_docs(tmp_path / "docs.yaml", pool(), deployment("resnet50", 50, 100), gw)
    with pytest.raises(CliError) as err:
        validate([str(docs)])
    assert err.value.code == 2 and "scheduler.no_such" in str(err.value)
