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
class _Duration:
    count: int = 0
    ns: int = 0

    def add(self, count: int, ns: int) -> None:
        self.count += count
        self.ns += ns

    def into(self, d: Any) -> None:  # a protobuf StatisticDuration
        d.count += self.count
        d.ns += self.ns


@dataclass
class _Served:
    """What one variant of a served model did at one version: Triton's statistics, read at
    the gateway. ``queue`` is a request's wait at the gateway until its batch is sent;
    ``compute_infer`` its batch's time from sent to answered (the replica, Triton's own
    queue and the network included); success and fail count answers with their whole time."""

    success: _Duration = field(default_factory=_Duration)
    fail: _Duration = field(default_factory=_Duration)
    queue: _Duration = field(default_factory=_Duration)
    compute_infer: _Duration = field(default_factory=_Duration)
    inference_count: int = 0  # rows inferred
    execution_count: int = 0  # batches sent
    last_ms: int = 0  # wall-clock ms when its last batch came back (Triton's last_inference)
    batches: dict[int, _Duration] = field(default_factory=dict)  # rows -> batches and their compute


class Statistics:
    """Triton-shaped statistics per served model, version and variant, fed by the driver."""

    def __init__(self) -> None:
        self._by: dict[tuple[str, str, str], _Served] = {}  # (model, version, variant)

    def _of(self, model: str, version: str, variant: str) -> _Served:
        s = self._by.get((model, version, variant))
        if s is None:
            s = self._by[(model, version, variant)] = _Served()
        return s

    def batch(self, model: str, version: str, variant: str, rows: int, queue_s: list[float],
              compute_s: float, ok: bool) -> None:
        """A batch of ``rows`` rows for ``len(queue_s)`` requests (each queued as given) came
        back after ``compute_s`` seconds, answered (``ok``) or failed."""
        s = self._of(model, version, variant)
        ns = int(compute_s * 1e9)
        n = len(queue_s)
        s.queue.add(n, int(sum(queue_s) * 1e9))
        s.execution_count += 1
        s.last_ms = int(time.time() * 1000)
        if ok:
            s.inference_count += rows
            s.compute_infer.add(n, ns * n)
            b = s.batches.get(rows)
            if b is None:
                b = s.batches[rows] = _Duration()
            b.add(1, ns)

    def answered(self, model: str, version: str, variant: str, ok: bool, total_s: float) -> None:
        """A request's answer (``ok``) or failure, ``total_s`` after it arrived."""
        s = self._of(model, version, variant)
        (s.success if ok else s.fail).add(1, int(total_s * 1e9))

    def forget(self, model: str) -> None:
        for key in [k for k in self._by if k[0] == model]:
            del self._by[key]

    def fill(self, resp: pb.ModelStatisticsResponse, model: str, default_version: str,
             version: str = "") -> None:
        """Add ``model``'s entries to ``resp``: one per version (every variant together; a
        request naming no version counts under the default one), then one per variant and
        version, named ``model/variant``. Only ``version`` when one is named."""
        rows = [(v or default_version, var, s) for (m, v, var), s in self._by.items() if m == model]
        rows = [r for r in rows if not version or r[0] == version]
        versions = sorted({v for v, _, _ in rows}) or [version or default_version]
        for v in versions:
            _entry(resp.model_stats.add(name=model, version=v), [s for rv, _, s in rows if rv == v])
        for v, var, s in sorted(rows, key=lambda r: (r[1], r[0])):
            if var:
                _entry(resp.model_stats.add(name=f"{model}/{var}", version=v), [s])


def _entry(out: Any, parts: list[_Served]) -> None:
    """Sum ``parts`` into one protobuf ModelStatistics."""
    st = out.inference_stats
    batches: dict[int, _Duration] = {}
    for s in parts:
        out.inference_count += s.inference_count
        out.execution_count += s.execution_count
        out.last_inference = max(out.last_inference, s.last_ms)
        s.success.into(st.success)
        s.fail.into(st.fail)
        s.queue.into(st.queue)
        s.compute_infer.into(st.compute_infer)
        for rows, d in s.batches.items():
            batches.setdefault(rows, _Duration()).add(d.count, d.ns)
    for rows in sorted(batches):
        b = out.batch_stats.add(batch_size=rows)
        batches[rows].into(b.compute_infer)


def _version_one(model: str) -> str:
    return "1"


@dataclass
class ServerInfo:
    """What both front doors answer about the server; ``stats`` are the driver's."""

    models: list[str]
    default_version: Callable[[str], str] = _version_one  # a model's default version (the driver's)
    stats: Statistics = field(default_factory=Statistics)

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}

    def statistics(self, model: str | None = None, version: str = "") -> pb.ModelStatisticsResponse:
        resp = pb.ModelStatisticsResponse()
        for name in [model] if model else self.models:
            self.stats.fill(resp, name, self.default_version(name), version)
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
