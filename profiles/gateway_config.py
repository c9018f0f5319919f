"""The gateway's config (``headrace serve --config FILE``): the settings it shares with the
``Gateway`` document and the models it serves, with their replicas.

In the bottom layer, beside the documents' schema, so the plan's rendering
(:mod:`placement.apply.render`) builds it typed and the gateway (:mod:`gateway.config`) reads
the same models. Minimal shape::

    listen: {host: 127.0.0.1, http_port: 8000, grpc_port: 8001}
    models:
      - name: resnet50            # the name clients address
        slo_ms: 100
        max_batch: 32
        priority: guaranteed      # or best-effort
        replicas:
          - url: 127.0.0.1:9000   # a Triton server's HTTP endpoint
            protocol: http        # or grpc (then url is its gRPC endpoint)
            variant: resnet50     # the Triton model name on that server
            profile: resnet50@A100-80GB/1g.10gb   # reference profile, or a profile YAML path
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from profiles.schema import (
    PATH,
    GatewaySettings,
    ModelName,
    Objective,
    PriorityClass,
    RequestSloMs,
    Strict,
    VariantName,
)


class TritonTlsConfig(Strict):
    """TLS from the gateway to one Triton: the CA that signed Triton's certificate and, for
    mutual TLS, the gateway's client certificate."""

    ca_file: str | None = Field(default=None, json_schema_extra=PATH, description="PEM CA bundle that signed "
                                "Triton's certificate (default: the system's CAs)")
    cert_file: str | None = Field(default=None, json_schema_extra=PATH,
                                  description="client certificate (PEM) for mutual TLS")
    key_file: str | None = Field(default=None, json_schema_extra=PATH,
                                 description="the client certificate's private key (PEM)")
    server_name: str | None = Field(default=None, min_length=1, description="name Triton's certificate is "
                                    "checked against (default: the url's host)")

    @model_validator(mode="after")
    def _pair(self) -> TritonTlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (mutual TLS needs both)")
        return self


class ReplicaConfig(Strict):
    """One Triton server the model runs on, and the profile the scheduler plans it with."""

    url: str = Field(min_length=3, description="host:port of the Triton server's endpoint for `protocol`")
    protocol: Literal["http", "grpc"] = Field(
        default="http",
        description="how the gateway talks to Triton: http (binary tensors, the leaner path) or grpc",
    )
    variant: VariantName = Field(description="Triton model name of the variant on that server")
    profile: str = Field(
        min_length=1,
        description="latency profile: 'variant@gpu/slice' from the reference set, or a profile YAML path",
    )
    max_inflight: int = Field(
        default=2, ge=1, le=64,
        description="batches sent to the replica at once; it runs them one after another, so 2 "
        "keeps the next batch waiting at Triton while one runs (the round trip overlaps it; the "
        "scheduler's pipeline_lead_s says how early the next batch is formed)",
    )
    overhead_ms: float = Field(
        default=0.0, ge=0, le=10_000,
        description="time every batch takes beyond the profile (network, Triton, gateway), added to "
        "the profile's latencies the scheduler plans with",
    )
    id: str | None = Field(default=None, description="replica id (default: variant@url)")
    price_per_hour: float | None = Field(
        default=None, ge=0, le=1e6,
        description="what the replica's hardware costs per hour (its slice's share of its GPU's price); a "
        "variant's cost per answer is its profile's seconds per row at full batches times this price "
        "(the cost objective and cost caps need it; the operator fills it from the GpuPool)",
    )
    tls: TritonTlsConfig | None = Field(default=None, description="speak TLS to this Triton (gRPC: its "
                                        "--grpc-use-ssl endpoint; HTTP: a TLS proxy in front of it)")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        v = v.removeprefix("grpc://").removeprefix("http://")
        host, _, port = v.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"url {v!r} must be host:port")
        return v


class ModelConfig(Strict):
    """A model clients address: its default SLO and priority, and its replicas."""

    name: ModelName = Field(description="served model name clients address")
    slo_ms: RequestSloMs = Field(default=100.0, description="default latency SLO, ms")
    max_batch: int = Field(default=32, ge=1, le=4096, description="largest batch the gateway forms")
    priority: PriorityClass = Field(default="guaranteed", description="default priority class of the model's requests")
    deadline_margin: float = Field(
        default=0.03, ge=0.0, le=0.5,
        description="fraction of each request's SLO kept outside the plan for what the gateway "
        "cannot see (client send, network, the answer's way back); batches aim at the rest",
    )
    objective: Objective = Field(
        default="accuracy",
        description="which allowed variant a request takes: accuracy = the most accurate predicted to meet "
        "its deadline; cost = the cheapest that meets its accuracy floor and deadline (best-effort "
        "requests always take the cheapest)",
    )
    replicas: list[ReplicaConfig] = Field(
        description="where the model runs; none: the model is addressable and refused no_replica (503, "
        "Retry-After) until a replica is added, as a best-effort model a partial plan sheds",
    )


class GatewayConfig(GatewaySettings):
    """``headrace serve``'s YAML: the gateway settings (:class:`~profiles.schema.GatewaySettings`)
    and the models with their replicas. The operator renders it from a plan
    (:func:`placement.apply.render.gateway_config`)."""

    models: list[ModelConfig] = Field(min_length=1, description="served models")
    base_dir: Path | None = Field(default=None, exclude=True, description="resolves relative profile paths")

    @model_validator(mode="after")
    def _unique(self) -> GatewayConfig:
        names = [m.name for m in self.models]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"model names must be unique; repeated: {sorted(dup)}")
        ids = [r.id or f"{r.variant}@{r.url}" for m in self.models for r in m.replicas]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"replica ids must be unique; repeated: {sorted(dup)}")
        return self
