"""What the gateway tells clients about itself in Triton's shapes: server metadata, model
metadata and config (the backend's, under the served name, without what names the backend's
files), per-model statistics, and the repository index. Both front doors (HTTP and gRPC)
read from here."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from gateway.errors import Unavailable

SERVER_NAME = "headrace"
SERVER_VERSION = "0.1.0"
# only what both front doors serve: request priority/timeout (schedule_policy), /config and
# ModelConfig, binary tensors (HTTP), request/response parameters, statistics. Not
# model_repository: it promises load/unload, which the gateway does not do (the index is served).
EXTENSIONS = ["schedule_policy", "model_configuration", "binary_tensor_data", "parameters", "statistics"]
# ModelConfig fields dropped from what clients see: backend parameters and repository agents'
# parameters can carry paths and secrets
PRIVATE_CONFIG_FIELDS = ("parameters", "model_repository_agents")


@dataclass
class _Counts:
    success: int = 0
    success_ns: int = 0
    fail: int = 0
    fail_ns: int = 0
    last_ms: int = 0


def _version_one(model: str) -> str:
    return "1"


@dataclass
class ServerInfo:
    models: list[str]
    clock: Callable[[], float] = time.monotonic
    default_version: Callable[[str], str] = _version_one  # a model's default version (the driver's)
    _counts: dict[str, _Counts] = field(default_factory=dict)

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}

    def record(self, model: str, start: float, ok: bool) -> None:
        c = self._counts.get(model)
        if c is None:
            c = self._counts[model] = _Counts()
        ns = int((self.clock() - start) * 1e9)
        if ok:
            c.success += 1
            c.success_ns += ns
        else:
            c.fail += 1
            c.fail_ns += ns
        c.last_ms = int(time.time() * 1000)

    def statistics(self, model: str | None = None) -> pb.ModelStatisticsResponse:
        resp = pb.ModelStatisticsResponse()
        for name in [model] if model else self.models:
            c = self._counts.get(name, _Counts())
            s = resp.model_stats.add(name=name, version=self.default_version(name), last_inference=c.last_ms,
                                     inference_count=c.success, execution_count=c.success)
            s.inference_stats.success.count = c.success
            s.inference_stats.success.ns = c.success_ns
            s.inference_stats.fail.count = c.fail
            s.inference_stats.fail.ns = c.fail_ns
        return resp

    def repository_index(self) -> list[dict[str, str]]:
        return [{"name": m, "version": self.default_version(m), "state": "READY"} for m in self.models]


def _info(model: Any) -> Any:
    if model.info is None:
        raise Unavailable(f"model '{model.served.name}' has no metadata yet")
    return model.info


def model_metadata_pb(model: Any, name: str) -> pb.ModelMetadataResponse:
    md = pb.ModelMetadataResponse()
    md.CopyFrom(_info(model).metadata)
    md.name = name
    del md.versions[:]
    md.versions.extend(model.version_list())
    return md


def model_metadata_dict(model: Any, name: str) -> dict[str, Any]:
    md = _info(model).metadata

    def tensors(ts: Any) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in ts]

    return {"name": name, "versions": model.version_list(), "platform": md.platform,
            "inputs": tensors(md.inputs), "outputs": tensors(md.outputs)}


def model_config_pb(model: Any, name: str) -> mc.ModelConfig:
    cfg = mc.ModelConfig()
    cfg.CopyFrom(_info(model).config)
    cfg.name = name
    for f in PRIVATE_CONFIG_FIELDS:
        cfg.ClearField(f)
    return cfg


def model_config_dict(model: Any, name: str) -> dict[str, Any]:
    d = json_format.MessageToDict(model_config_pb(model, name), preserving_proto_field_name=True)
    for key in ("input", "output"):
        for t in d.get(key, []):
            if "dims" in t:
                t["dims"] = [int(x) for x in t["dims"]]
    return d
