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
    llm_models:                   # generative models, served on the OpenAI API (/v1/...)
      - name: llama-8b
        slo_ttft_ms: 500          # defaults; a request's x-slo-ttft-ms / x-slo-tpot-ms override
        slo_tpot_ms: 50
        replicas:
          - url: http://127.0.0.1:9100   # an OpenAI-compatible engine
            engine: vllm                 # sglang, tgi, triton-openai or emulated
            model: meta-llama/Llama-3.1-8B-Instruct   # its served model name (default: name)
            profile: llama-3.1-8b-instruct-bf16@H100-80GB/gpu   # the engine model routers predict with
    llm_routing:                  # how generative requests are spread over each model's engines
      router: headrace            # or round-robin, least-request, pow2, sglang, llm-d, llm-d-precise, dynamo, ...

``models`` or ``llm_models`` may be empty, not both.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

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
    id: str | None = Field(default=None, min_length=1, description="replica id, shown in /metrics labels and "
                           "errors (default: variant#k, the variant's k-th replica without one; never its url)")
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
        "requests always take the cheapest); infaas = INFaaS's choice, a baseline: the cheapest meeting the "
        "floor and, by profile, the SLO that is not overloaded, with no admission by prediction",
    )
    replicas: list[ReplicaConfig] = Field(
        description="where the model runs; none: the model is addressable and refused no_replica (503, "
        "Retry-After) until a replica is added, as a best-effort model a partial plan sheds",
    )


# triton: a decoupled model on Triton's HTTP port, over its generate_stream; the others speak the OpenAI API
LlmEngine = Literal["vllm", "sglang", "tgi", "triton-openai", "emulated", "triton"]


LlmRouterName = Literal["headrace", "round-robin", "least-request", "pow2", "sglang", "llm-d", "llm-d-precise",
                        "dynamo", "dynamo-approx"]


class LlmRoutingConfig(Strict):
    """Which router spreads a generative model's requests over its engines (one router per
    model). A request's band comes from its ``x-headrace-priority`` header (critical, standard,
    sheddable, or the KServe path's guaranteed = standard and best-effort = sheddable, mapped by
    :data:`profiles.schema.PRIORITY_BANDS`), else its model's ``priority``; its tenant from
    ``x-headrace-tenant``, else the body's ``user``. Held requests follow the gateway's
    ``flow_control``."""

    router: LlmRouterName = Field(
        default="headrace", description="headrace (predicted TTFT/TPOT from each engine's profile, with flow "
        "control), or a baseline: round-robin, least-request, pow2, sglang, llm-d, llm-d-precise, dynamo, "
        "dynamo-approx (Dynamo without KV events)")
    seed: int = Field(default=0, ge=0, le=2**63 - 1, description="seed of the routers that draw at random")


class LlmReplicaConfig(Strict):
    """One engine serving an LLM model: OpenAI-compatible, or a Triton decoupled model."""

    url: str = Field(min_length=8, description="http://host:port of the engine's OpenAI API (its /v1 lies below), "
                     "or of Triton's HTTP port (engine: triton)")
    engine: LlmEngine = Field(default="vllm", description="the engine's kind: vllm, sglang, tgi, triton-openai "
                              "or emulated (headrace engine), spoken to over the OpenAI API; or triton, a "
                              "decoupled model spoken to over Triton's generate_stream")
    metrics_url: str | None = Field(default=None, min_length=8, description="http://host:port whose /metrics "
                                    "carries the engine's vllm: load gauges (default: url; for engine: triton, "
                                    "Triton's metrics port, else only its readiness is read)")
    model: VariantName | None = Field(default=None, description="the engine's served model name (default: the "
                                      "model's name)")
    id: str | None = Field(default=None, min_length=1, description="replica id, shown in /metrics labels and "
                           "errors (default: name#k, the model's k-th engine without one; never its url)")
    max_inflight: int = Field(default=256, ge=1, le=100_000,
                              description="requests the gateway keeps open at the engine at once; past it on "
                              "every replica, a request is held or refused 429")
    profile: str | None = Field(default=None, min_length=1, description="the engine's LLM profile: a reference "
                                "profile's name (variant@gpu/slice[/tpN]) or an LlmProfile YAML path; routers "
                                "predict its step time, KV blocks and front end from it (none: they do not "
                                "predict for this engine)")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1, description="the engine's "
                                          "--gpu-memory-utilization, which sizes its KV cache from the profile")

    @field_validator("url", "metrics_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        parts = urlsplit(v)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme != "http" or not parts.hostname or port is None or parts.path not in ("", "/"):
            raise ValueError(f"url {v!r} must be http://host:port")
        return f"http://{parts.netloc}"


class LlmModelConfig(Strict):
    """A generative model clients address on the OpenAI API: its default token SLOs, priority and
    engines."""

    name: ModelName = Field(description="model name clients send in the request's `model`")
    slo_ttft_ms: RequestSloMs = Field(default=1000.0, description="default time-to-first-token SLO, ms")
    slo_tpot_ms: RequestSloMs = Field(default=100.0, description="default time-per-output-token SLO, ms")
    priority: PriorityClass = Field(default="guaranteed", description="default priority class of its requests")
    replicas: list[LlmReplicaConfig] = Field(
        description="the engines it runs on; none: addressable and answered 503 until one is added")

    def replica_id(self, r: LlmReplicaConfig, taken: Collection[str] = ()) -> str:
        """``r``'s id: its own, else :func:`default_replica_id` of this model past ``taken``."""
        return r.id or default_replica_id(self.name, taken)


def default_replica_id(name: str, taken: Collection[str]) -> str:
    """The id of a replica configured without one: ``name#k`` for the lowest k >= 1 not in
    ``taken``. It never names the replica's address: ids show in ``/metrics`` labels and in
    errors clients read, where backends stay hidden."""
    k = 1
    while f"{name}#{k}" in taken:
        k += 1
    return f"{name}#{k}"


class GatewayConfig(GatewaySettings):
    """``headrace serve``'s YAML: the gateway settings (:class:`~profiles.schema.GatewaySettings`)
    and the models with their replicas. The operator renders it from a plan
    (:func:`placement.apply.render.gateway_config`)."""

    models: list[ModelConfig] = Field(default_factory=list, description="served models (KServe v2 / Triton)")
    llm_models: list[LlmModelConfig] = Field(default_factory=list,
                                             description="generative models served on the OpenAI API")
    llm_routing: LlmRoutingConfig = Field(default_factory=LlmRoutingConfig,
                                          description="how generative requests are routed to their engines")
    write_timeout_s: float = Field(
        default=30.0, gt=0, le=3600,
        description="a streamed answer whose client reads nothing for this long (its socket's buffers "
        "full) is aborted, and its request aborted at the engine")
    base_dir: Path | None = Field(default=None, exclude=True, description="resolves relative profile paths")

    @model_validator(mode="after")
    def _unique(self) -> GatewayConfig:
        if not self.models and not self.llm_models:
            raise ValueError("serve at least one model: models and llm_models are both empty")
        names = [m.name for m in self.models] + [m.name for m in self.llm_models]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"model names must be unique; repeated: {sorted(dup)}")
        ids = [r.id for m in self.models for r in m.replicas if r.id is not None]
        ids += [r.id for m in self.llm_models for r in m.replicas if r.id is not None]
        dup = {i for i in ids if ids.count(i) > 1}
        if dup:
            raise ValueError(f"replica ids must be unique; repeated: {sorted(dup)}")
        taken = set(ids)  # each replica without an id gets one here, in config order: stable
        for m in self.models:
            for r in m.replicas:
                if r.id is None:
                    r.id = default_replica_id(r.variant, taken)
                    taken.add(r.id)
        for lm in self.llm_models:
            for lr in lm.replicas:
                if lr.id is None:
                    lr.id = default_replica_id(lm.name, taken)
                    taken.add(lr.id)
        return self
