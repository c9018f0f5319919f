"""The operator's configuration schema: ``GpuPool``, ``ModelDeployment`` and ``Gateway`` documents.

One definition of every field, kept in the bottom layer so the gateway (its settings), the
planner (pool and demand), the simulator and the operator all read the same models. Documents
follow Kubernetes conventions (apiVersion, kind, metadata, spec). :func:`load_documents`
reports a bad document in one line: file, document index, field path and the value given.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from profiles.catalogue import GPUS, HOST

API_VERSION = "headrace.dev/v1"


class SpecError(ValueError):
    """An invalid document; the message names file, document, field and value."""


class Strict(BaseModel):
    """A model that refuses fields it does not declare (a typo is an error, not a silent default)."""

    model_config = ConfigDict(extra="forbid")


PATH: dict[str, Any] = {"path": True}
"""``json_schema_extra`` of a field that holds a file path: ``~`` is the home folder and a
relative path is read from the folder of the YAML file that gives it. The JSON Schema carries
the mark (``"path": true``); the operator makes every such field absolute (:func:`is_path`)."""


def is_path(f: FieldInfo) -> bool:
    """Whether the field holds a file path (marked with :data:`PATH`)."""
    return isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get("path") is True


def absolute_path(value: str, base: Path | None) -> str:
    """The file a :data:`PATH` field's ``value`` names: ``~`` expanded, a relative path taken
    from ``base`` (the folder of the YAML file that gives it; None: left relative), a
    ``scheme://`` prefix kept."""
    scheme, sep, rest = value.partition("://")
    if sep:
        return f"{scheme}://{absolute_path(rest, base)}"
    path = Path(value).expanduser()
    if path.is_absolute() or base is None:
        return str(path) if value.startswith("~") else value
    return str((base / path).resolve())


Host = Annotated[str, Field(min_length=1)]
Port = Annotated[int, Field(ge=0, le=65535)]
ModelName = Annotated[str, Field(min_length=1, max_length=200)]  # the name clients address
VariantName = Annotated[str, Field(min_length=1, max_length=200)]  # the Triton model name of a variant
RequestSloMs = Annotated[float, Field(gt=0, le=3_600_000)]  # a request's latency objective, ms
PriorityClass = Literal["guaranteed", "best-effort"]
Band = Literal["critical", "standard", "sheddable"]  # priority bands, as the Gateway API Inference Extension names them
# the one mapping of the KServe path's priority classes to the bands
PRIORITY_BANDS: dict[str, str] = {"guaranteed": "standard", "best-effort": "sheddable"}
Objective = Literal["accuracy", "cost", "infaas"]  # which allowed variant a request takes (gateway.policy.selector)


class Metadata(Strict):
    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
                      description="object name (lower-case letters, digits, '-' and '.')")
    labels: dict[str, str] = Field(default_factory=dict, description="free-form labels")


class _Document(Strict):
    """What every kind has: the schema version and the object's name and labels."""

    apiVersion: Literal["headrace.dev/v1"] = Field(default=API_VERSION, description="schema version")
    metadata: Metadata = Field(description="the object's name and labels")


# --------------------------------------------------------------------------- GpuPool


class GpuGroup(Strict):
    model: str = Field(min_length=1, description=f"GPU model, one of {', '.join(GPUS)} "
                                                  f"('{HOST}': the host's cores, for CPU-served models)")
    count: int = Field(ge=1, le=10_000, description="GPUs of this model on the node")
    cost_per_hour: float = Field(default=1.0, gt=0, le=10_000, description="price of one GPU-hour")
    mig: bool = Field(default=True, description="MIG partitioning allowed (never on the host)")
    mps: bool = Field(default=True, description="MPS sharing allowed (inside a whole GPU or a slice); "
                                                "on the host: co-located server processes")

    @field_validator("model")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in GPUS:
            raise ValueError(f"model ({v!r}) is not a known GPU; known: {', '.join(GPUS)}")
        return v

    @model_validator(mode="after")
    def _host(self) -> GpuGroup:
        if self.model == HOST:
            self.mig = False
        return self


class Node(Strict):
    name: str = Field(min_length=1, max_length=253, description="node name, the prefix of GPU ids")
    gpus: list[GpuGroup] = Field(min_length=1, max_length=64, description="GPU groups on the node")


class GpuPoolSpec(Strict):
    nodes: list[Node] = Field(min_length=1, max_length=10_000, description="nodes and their GPUs")
    objective: Literal["gpus", "cost", "accuracy"] = Field(
        default="gpus", description="what the planner optimises, every model's rate served at its SLO: "
        "gpus = the fewest GPUs; cost = the least cost per hour; accuracy = the highest rate-weighted "
        "mean accuracy of the answers (as the gateway splits them across variants) within max_gpus / "
        "max_cost_per_hour, then the fewest GPUs")
    max_gpus: int | None = Field(default=None, ge=1, le=1_000_000,
                                 description="objective accuracy: GPUs the plan may use (default: the pool)")
    max_cost_per_hour: float | None = Field(default=None, gt=0, le=1e9,
                                            description="objective accuracy: cost per hour the plan may "
                                            "reach (default: the pool's)")
    mean_accuracy_floor: float | None = Field(
        default=None, ge=0, le=1, description="every model's predicted rate-weighted mean accuracy of "
        "answers is at least this (unknown accuracy counts 0; a model with no variant of known "
        "accuracy is exempt); with gpus or cost: the fewest GPUs or least cost that meet it")
    emulate: bool = Field(default=False, description="serve on emulated GPUs (no hardware)")
    runtime: Literal["local", "ray"] = Field(
        default="local", description="where headrace up runs the replicas: local = processes on this "
        "machine; ray = Ray actors on the cluster at --ray ADDRESS (else $RAY_ADDRESS), pinned by "
        "custom resources (docs/ray.md)")

    @model_validator(mode="after")
    def _unique(self) -> GpuPoolSpec:
        names = [n.name for n in self.nodes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"node names must be unique, got {dup} more than once")
        return self

    @model_validator(mode="after")
    def _budget(self) -> GpuPoolSpec:
        if self.objective != "accuracy":
            for name in ("max_gpus", "max_cost_per_hour"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} ({getattr(self, name):g}) is a budget for objective accuracy, "
                                     f"not {self.objective!r}")
        total = sum(g.count for n in self.nodes for g in n.gpus)
        if self.max_gpus is not None and self.max_gpus > total:
            raise ValueError(f"max_gpus ({self.max_gpus}) exceeds the pool's {total} GPUs")
        return self


class GpuPool(_Document):
    kind: Literal["GpuPool"] = Field(default="GpuPool", description="document kind")
    spec: GpuPoolSpec


# --------------------------------------------------------------------------- ModelDeployment


class ArtifactSpec(Strict):
    uri: str = Field(min_length=1, json_schema_extra=PATH, description="a Triton model directory (a path, "
                     "relative to the YAML file, or file://...) holding config.pbtxt and numbered version folders")
    version: int | None = Field(default=None, ge=1, le=2**31 - 1,
                                description="the version folder to serve (default: the highest)")

    @field_validator("uri")
    @classmethod
    def _local(cls, v: str) -> str:
        scheme, sep, _ = v.partition("://")
        if sep and scheme != "file":
            raise ValueError(f"uri {v!r}: only local paths and file:// are served here (got scheme {scheme!r})")
        return v


class VariantSpec(Strict):
    name: VariantName = Field(description="variant name: the Triton model name "
                      "and the profiles' `variant`")
    artifact: ArtifactSpec | None = Field(default=None, description="the model's files "
                                          "(required when the deployment's source is 'artifact')")
    profile: str | None = Field(default=None, json_schema_extra=PATH, description="latency profile YAML for this variant "
                                "(headrace profile writes one); default: the reference profiles")


class AutoscalingSpec(Strict):
    """How one deployment autoscales (:func:`placement.autoscale.step` reads it). Hysteresis:
    up when the observed rate stays above the planned rate for ``upscale_delay_s``, down when
    it stays below ``planned x downscale_below`` for ``downscale_delay_s``; the new planned rate
    is the run's largest observed rate / ``target_utilization``, inside that band, so a steady
    load never flaps. Every time is in seconds, every rate in req/s."""

    enabled: bool = Field(default=True, description="re-plan when the observed rate leaves the planned band")
    min_replicas: int = Field(default=1, ge=0, le=10_000, description="fewest replicas kept")
    max_replicas: int | None = Field(default=None, ge=1, le=10_000, description="most replicas (None: the pool)")
    upscale_delay_s: float = Field(default=10.0, ge=0, le=86_400,
                                   description="observed rate above the planned rate this long -> scale up")
    downscale_delay_s: float = Field(default=60.0, ge=0, le=86_400,
                                     description="observed rate below downscale_below x planned this long -> scale down")
    downscale_below: float = Field(default=0.5, ge=0, lt=1,
                                   description="fraction of the planned rate under which load counts as low "
                                   "(0: never scale down); below target_utilization")
    target_utilization: float = Field(default=0.7, gt=0, le=1,
                                      description="after a scale event, planned rate = the largest rate observed "
                                      "during the delay / target_utilization")
    cooldown_s: float | None = Field(default=None, ge=0, le=86_400,
                                     description="after a scale event, one in the opposite direction waits this "
                                     "long (None: upscale_delay_s)")
    cold_start_timeout_s: float = Field(default=60.0, gt=0, le=3_600,
                                        description="with min_replicas 0 (scale to zero): how long a request "
                                        "waits for the model's first replica before 503 with Retry-After")
    min_rate: float | None = Field(default=None, ge=0, le=1e7,
                                   description="the planned rate never goes below this (None: no floor; "
                                   "min_replicas still holds)")

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) is below min_replicas ({self.min_replicas})")
        if self.downscale_below >= self.target_utilization:
            raise ValueError(f"downscale_below ({self.downscale_below:g}) must be below target_utilization "
                             f"({self.target_utilization:g}): a load that just scaled would sit at or under the "
                             "down threshold and flap")
        return self

    @property
    def cooldown(self) -> float:
        """The effective cooldown in seconds (``cooldown_s``, or ``upscale_delay_s`` if unset)."""
        return self.upscale_delay_s if self.cooldown_s is None else self.cooldown_s


class RolloutSpec(Strict):
    """How a change to a deployment's replicas rolls out, as a Kubernetes Deployment's
    ``RollingUpdate`` strategy and ``progressDeadlineSeconds`` do: each successor starts beside
    its predecessor and must be Ready before it stops, ``max_surge`` of them at once."""

    max_surge: int = Field(default=1, ge=1, le=10_000,
                           description="successors of this deployment started at once during a change, each "
                           "beside the replica it replaces, which stops once it is Ready (Kubernetes' "
                           "maxSurge; at most one per slice at a time, whose memory holds both)")

    max_unavailable: int = Field(default=0, ge=0, le=10_000,
                                 description="replicas of this deployment that may be down at once during a change "
                                 "(0: a change that cannot keep every replica serving is refused, unless "
                                 "apply --allow-disruption)")
    progress_deadline_s: float = Field(default=120.0, gt=0, le=3_600,
                                       description="a new replica not Ready this long fails the change, which "
                                       "is then rolled back")


Source = Literal["emulated", "digits", "artifact"]


class TokenLengths(Strict):
    """Token counts of a deployment's requests: ``fixed`` at ``mean``, or ``lognormal`` with that
    mean and ``sigma``; every draw is at least 1 and at most ``max``."""

    dist: Literal["fixed", "lognormal"] = Field(default="lognormal", description="fixed or lognormal")
    mean: float = Field(ge=1, le=1_000_000, description="mean tokens")
    sigma: float = Field(default=0.8, ge=0, le=4, description="lognormal: standard deviation of the log")
    max: int | None = Field(default=None, ge=1, le=10_000_000, description="largest draw (default: the context)")

    @model_validator(mode="after")
    def _cap(self) -> TokenLengths:
        if self.max is not None and self.max < self.mean:
            raise ValueError(f"max ({self.max}) is below mean ({self.mean:g})")
        return self


class LlmSpec(Strict):
    """A generative deployment: engines on whole GPUs behind the gateway's OpenAI API. Its
    ``slo_ms`` is the time-to-first-token objective, its ``rate`` the expected requests per
    second, its ``variants`` LLM profile variants (a name, or {name, profile: LlmProfile YAML})."""

    engine: Literal["emulated", "vllm"] = Field(default="emulated", description="the engine kind; headrace up "
                                                "starts emulated engines (headrace engine)")
    slo_tpot_ms: RequestSloMs = Field(description="time-per-output-token objective, ms")
    input_tokens: TokenLengths = Field(default_factory=lambda: TokenLengths(mean=512),
                                       description="prompt lengths (sizes the replicas)")
    output_tokens: TokenLengths = Field(default_factory=lambda: TokenLengths(mean=128),
                                        description="generated lengths (sizes the replicas)")
    replicas: int | None = Field(default=None, ge=1, le=10_000, description="engines to run (default: as many as "
                                 "keep 90% of requests within both SLOs at rate x headroom)")


class ModelDeploymentSpec(Strict):
    model: ModelName = Field(description="the model name clients address (the profiles' `model`), e.g. resnet50")
    rate: float = Field(ge=0, le=1e7, description="expected requests per second")
    slo_ms: float = Field(gt=0, le=600_000, description="latency objective per request, ms")
    source: Source = Field(default="emulated", description="where the variants' models come from: "
                           "'emulated' (an emulated GPU replaying the profile), 'digits' (the built-in "
                           "real MLP family, trained at set-up), 'artifact' (each variant's artifact)")
    variants: list[str | VariantSpec] = Field(
        default_factory=list, max_length=64,
        description="allowed variants (names or {name, artifact, profile}); empty: every profiled variant")
    accuracy_floor: float | None = Field(default=None, ge=0, le=1, description="least acceptable accuracy")
    priority: PriorityClass = Field(default="guaranteed", description="priority class")
    objective: Objective = Field(
        default="accuracy",
        description="which allowed variant a request takes at the gateway: accuracy = the most accurate "
        "predicted to meet its deadline; cost = the cheapest that meets its accuracy floor and deadline "
        "(cost per answer: profile seconds per row x the slice's share of the pool's cost_per_hour); "
        "infaas = INFaaS's choice, a baseline (gateway.policy.selector)")
    headroom: float = Field(default=1.1, ge=1.0, le=10.0,
                            description="planned capacity / expected rate (burst margin)")
    autoscaling: AutoscalingSpec | None = Field(default=None, description="re-plan from observed load "
                                                "(off when absent)")
    replicas: int | None = Field(default=None, ge=1, le=10_000, description="at least this many replicas, each "
                                 "on its own GPU and on its own node where the pool has them (the rate may need "
                                 "more); with autoscaling, the larger of this and min_replicas")
    llm: LlmSpec | None = Field(default=None, description="a generative model (OpenAI API), with slo_ms its "
                                "time to first token")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="how a change rolls out")

    @model_validator(mode="after")
    def _variants(self) -> ModelDeploymentSpec:
        names = [v if isinstance(v, str) else v.name for v in self.variants]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"variants must be unique, got {dup} more than once")
        if self.source == "artifact":
            missing = [n for n, v in zip(names, self.variants, strict=True)
                       if isinstance(v, str) or v.artifact is None]
            if not names or missing:
                raise ValueError(f"source 'artifact' needs an artifact for every variant; "
                                 f"missing for {missing or 'all (no variants listed)'}")
        a = self.autoscaling
        if self.replicas is not None and a is not None and a.max_replicas is not None and self.replicas > a.max_replicas:
            raise ValueError(f"replicas ({self.replicas}) exceeds autoscaling.max_replicas ({a.max_replicas})")
        if self.llm is not None:
            given = [n for n in ("source", "autoscaling", "replicas") if n in self.model_fields_set]
            if given or any(not isinstance(v, str) and v.artifact is not None for v in self.variants):
                raise ValueError(f"{', '.join(given) or 'variants[].artifact'} is for classic deployments; an "
                                 "llm deployment's variants are LLM profiles served on engines")
        return self

    def variant_specs(self) -> list[VariantSpec]:
        return [VariantSpec(name=v) if isinstance(v, str) else v for v in self.variants]

    def variant_names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.variant_specs())


class ModelDeployment(_Document):
    kind: Literal["ModelDeployment"] = Field(default="ModelDeployment", description="document kind")
    spec: ModelDeploymentSpec


# --------------------------------------------------------------------------- Gateway


class ListenConfig(Strict):
    host: Host = Field(default="127.0.0.1", description="address the gateway binds")
    http_port: Port = Field(default=8000, description="KServe v2 HTTP port (0: any free)")
    grpc_port: Port = Field(default=8001, description="KServe v2 gRPC port (0: any free)")


class LimitsSpec(Strict):
    """What the front door accepts before it refuses, each with a safe default."""

    max_connections: int = Field(default=10_000, ge=1, le=1_000_000,
                                 description="client connections served at once; past it new ones are closed")
    probe_connections: int = Field(default=32, ge=0, le=10_000,
                                   description="connections kept beyond max_connections for health probes "
                                   "(/v2/health/*), so an orchestrator still sees the gateway at the cap")
    max_header_bytes: int = Field(default=64 << 10, ge=1024, le=16 << 20,
                                  description="request line plus headers, bytes (431 past it)")
    max_headers: int = Field(default=100, ge=8, le=10_000, description="headers per request (431 past it)")
    max_url_bytes: int = Field(default=8 << 10, ge=256, le=1 << 20, description="request URL, bytes (414 past it)")
    header_timeout_s: float = Field(default=10.0, gt=0, le=3600,
                                    description="a request's headers must arrive within this (408 after)")
    body_timeout_s: float = Field(default=60.0, gt=0, le=3600,
                                  description="a request's body must arrive within this of its headers (408 after)")
    idle_timeout_s: float = Field(default=75.0, gt=0, le=86_400,
                                  description="an idle keep-alive connection is closed after this")
    max_buffered_bytes: int = Field(default=256 << 20, ge=1 << 20, le=1 << 40,
                                    description="request bytes buffered across all connections; past it "
                                    "new bodies get 503 with Retry-After")
    max_json_depth: int = Field(default=64, ge=4, le=10_000,
                                description="nesting depth of a JSON request (400 past it)")
    max_address_connections: int = Field(default=1024, ge=1, le=1_000_000,
                                         description="connections from one client address at once, probe "
                                         "room included; past it new ones from that address are closed, so "
                                         "one host cannot fill the room kept for others' health probes")
    max_client_buffered_bytes: int = Field(default=128 << 20, ge=1 << 20, le=1 << 40,
                                           description="request bytes buffered for one client (its tenant, or "
                                           "its address where the gateway has no API keys); past it its new "
                                           "bodies get 429 with Retry-After")
    max_queued_requests: int = Field(default=100_000, ge=1, le=100_000_000,
                                     description="inference requests admitted and not yet answered, all "
                                     "clients together (Triton's max_queue_size); past it 429")
    max_queued_bytes: int = Field(default=1 << 30, ge=1 << 20, le=1 << 42,
                                  description="input bytes of the requests admitted and not yet answered, "
                                  "all clients together; past it 429")
    max_client_queued_requests: int = Field(default=10_000, ge=1, le=100_000_000,
                                            description="inference requests admitted and not yet answered "
                                            "for one client (its tenant, or its address where the gateway has "
                                            "no API keys); past it 429")
    max_client_queued_bytes: int = Field(default=256 << 20, ge=1 << 20, le=1 << 42,
                                         description="input bytes admitted and not yet answered for one "
                                         "client; past it 429")
    # the gRPC listener: grpc core's channel arguments (gateway.frontdoor.grpc.server_options);
    # the keepalive fields default to Triton's own --grpc-* keepalive defaults
    grpc_max_connections: int = Field(default=4096, ge=1, le=1_000_000,
                                      description="gRPC client connections open at once (a client's channel "
                                      "carries all its calls on one); past it a new one is closed as it is "
                                      "accepted (grpc.max_allowed_incoming_connections)")
    grpc_idle_timeout_s: float = Field(default=300.0, gt=0, le=86_400,
                                       description="a gRPC connection with no call open is closed after this "
                                       "(GOAWAY; grpc.max_connection_idle_ms); a client's channel connects "
                                       "again on its next call")
    grpc_handshake_timeout_s: float = Field(default=10.0, gt=0, le=3600,
                                            description="a new gRPC connection must finish its TLS handshake and "
                                            "send its HTTP/2 settings within this, else it is closed "
                                            "(grpc.server_handshake_timeout_ms)")
    grpc_stream_pending: int = Field(default=256, ge=1, le=1_000_000,
                                     description="requests of one ModelStreamInfer call in flight or answered "
                                     "and not yet sent: past it the call's next request is not read (HTTP/2 "
                                     "flow control then holds the client), so a client that sends and never "
                                     "reads holds this many answers, not all of them")
    grpc_max_concurrent_streams: int = Field(default=4096, ge=1, le=2**31 - 1,
                                             description="calls open at once on one gRPC connection (HTTP/2 "
                                             "SETTINGS_MAX_CONCURRENT_STREAMS); a call past it is refused "
                                             "(RST_STREAM REFUSED_STREAM: UNAVAILABLE to grpc clients, which "
                                             "do not hold it back)")
    grpc_keepalive_time_s: float = Field(default=7200.0, gt=0, le=86_400 * 365,
                                         description="the gateway pings a gRPC client after this without "
                                         "traffic (grpc.keepalive_time_ms; Triton: 7200 s)")
    grpc_keepalive_timeout_s: float = Field(default=20.0, gt=0, le=3600,
                                            description="a client that does not answer the gateway's ping "
                                            "within this is disconnected (grpc.keepalive_timeout_ms; Triton: 20 s)")
    grpc_keepalive_permit_without_calls: bool = Field(
        default=False, description="clients may ping on a connection with no call open as often as "
        "grpc_min_ping_interval_s (false: once per 2 hours; grpc.keepalive_permit_without_calls; Triton: false)")
    grpc_min_ping_interval_s: float = Field(default=300.0, gt=0, le=86_400,
                                            description="a client's pings closer together than this while no "
                                            "data flows are strikes (grpc.http2.min_ping_interval_without_data_ms;"
                                            " Triton: 300 s)")
    grpc_max_ping_strikes: int = Field(default=2, ge=0, le=1000,
                                       description="past this many strikes the connection gets GOAWAY "
                                       "(ENHANCE_YOUR_CALM, too_many_pings) and is closed; 0: never "
                                       "(grpc.http2.max_ping_strikes; Triton: 2)")


class CertificateSpec(Strict):
    """The certificate and key a server presents (TLS)."""

    cert_file: str = Field(min_length=1, json_schema_extra=PATH,
                           description="PEM certificate chain the server presents (its own certificate first, "
                           "then any intermediates); a relative path is read from the YAML file's folder")
    key_file: str = Field(min_length=1, json_schema_extra=PATH,
                          description="PEM private key of cert_file (not encrypted)")


class TlsSpec(CertificateSpec):
    """TLS on the gateway's HTTP and gRPC listeners; with ``client_ca_file``, mutual TLS."""

    client_ca_file: str | None = Field(default=None, min_length=1, json_schema_extra=PATH,
                                       description="PEM CA certificates: when set, a client must present a "
                                       "certificate one of them signed, or its connection is refused (mutual TLS)")


class ApiKeySpec(Strict):
    """One API key of a tenant, named by where it is kept or by its digest, never written out.
    Keys are read once at start and only their digests are kept; a key given by environment
    variable stays readable in /proc/PID/environ to the same user for the process's life."""

    env: str | None = Field(default=None, min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                            description="environment variable holding the key (read at start; unset is an error); "
                            "it stays readable in /proc/PID/environ to the same user (file or fd do not)")
    file: str | None = Field(default=None, min_length=1, json_schema_extra=PATH,
                             description="file holding the key (surrounding "
                             "whitespace dropped); a relative path is read from the YAML file's folder")
    fd: int | None = Field(default=None, ge=0, le=65_535,
                           description="open file descriptor the key is read from once at start: its first line, "
                           "or up to end of file (headrace serve ... 3< keyfile, or 3< <(vault read ...))")
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$",
                               description="hex SHA-256 digest of the key (printf %s \"$KEY\" | sha256sum)")

    @model_validator(mode="after")
    def _one(self) -> ApiKeySpec:
        given = [k for k in ("env", "file", "fd", "sha256") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"a key is exactly one of env, file, fd or sha256 (got {given or 'none'})")
        if self.sha256 is not None:
            self.sha256 = self.sha256.lower()
        return self


class QuotaSpec(Strict):
    """A tenant's request rate: a token bucket of ``burst`` requests refilled at ``rate`` per second."""

    rate: float = Field(gt=0, le=10_000_000, description="inference requests per second admitted on average")
    burst: int | None = Field(default=None, ge=1, le=10_000_000,
                              description="inference requests admitted at once after a quiet spell (the "
                              "bucket's size); default: one second of rate, at least 1")


UNAUTHENTICATED = "unauthenticated"  # the tenant label of refused requests


class TenantSpec(Strict):
    """A client of the gateway: its API keys, its priority class and its quota."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                      description="tenant name (the tenant label of headrace_tenant_requests_total)")
    keys: list[ApiKeySpec] = Field(min_length=1, max_length=64,
                                   description="API keys that identify the tenant (several: rotation)")
    priority: PriorityClass | None = Field(
        default=None, description="priority class of every request of the tenant; unset: each request's "
        "own priority parameter, else its model's class")
    quota: QuotaSpec | None = Field(default=None, description="inference rate limit (none when absent); "
                                    "past it: 429 with Retry-After and x-headrace-reject-reason: quota")
    metrics: bool = Field(default=False, description="the tenant's keys may read /metrics on the main port, "
                          "which shows every tenant's names and counts (the scraper's or an operator's key); "
                          "another tenant's key gets 403 there. The metrics_listen listener needs no key")

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        if v == UNAUTHENTICATED:
            raise ValueError(f"tenant name {v!r} is reserved for requests without a valid key")
        return v


class ListenAddress(Strict):
    host: Host = Field(default="127.0.0.1", description="address to bind")
    port: Port = Field(description="port (0: any free)")


class AccessLogSpec(Strict):
    """Structured access logs: one JSON line per inference request answered or refused
    (time, tenant, protocol, model, version, variant, status, queue_ms, total_ms, rows, reason,
    request_id)."""

    enabled: bool = Field(default=False, description="write access logs (off: they cost nothing)")
    sample: float = Field(default=1.0, ge=0, le=1, description="fraction of successful answers logged, "
                          "each drawn at random; refusals and errors are all logged unless sample_failures")
    sample_failures: bool = Field(default=False, description="sample refusals and errors by `sample` too "
                                  "(bounds the log under a heavy overload); off: every one is logged")
    path: str | None = Field(default=None, min_length=1, description="file the lines are appended to "
                             "(headrace serve reads a relative path from its config's folder); absent: stderr")


class TracingSpec(Strict):
    """OpenTelemetry spans of requests (admission, queue), batches and Triton calls, with the
    W3C traceparent carried to Triton. Needs the tracing extra: pip install 'headrace[tracing]'."""

    enabled: bool = Field(default=False, description="trace requests (off: no OpenTelemetry is loaded)")
    exporter: Literal["otlp", "console", "memory"] = Field(
        default="otlp", description="where spans go: 'otlp' (OTLP/gRPC to endpoint), 'console' (stdout), "
        "'memory' (kept in the process: tests and embedding)")
    endpoint: str = Field(default="http://localhost:4317", min_length=1, max_length=2048,
                          description="OTLP/gRPC collector address (http:// plain text, https:// TLS)")
    service_name: str = Field(default="headrace-gateway", min_length=1, max_length=255,
                              description="service.name of the gateway's spans")
    sample_ratio: float = Field(default=1.0, ge=0, le=1, description="fraction of requests without a "
                                "client's traceparent that start a recorded trace; a client's sampled "
                                "traceparent is always followed, an unsampled one never")


class QueueLimits(Strict):
    """Requests held per priority band at once, per model; past it a request of the band is
    refused (429). Unset: the router's default."""

    critical: int | None = Field(default=None, ge=0, le=1_000_000, description="critical requests held at once")
    standard: int | None = Field(default=None, ge=0, le=1_000_000, description="standard requests held at once")
    sheddable: int | None = Field(default=None, ge=0, le=1_000_000,
                                  description="sheddable requests held at once (0: never held, refused when no "
                                  "replica takes them now)")


class FlowControlSpec(Strict):
    """What the gateway does with requests no replica should take yet: a bounded queue per
    priority band (critical, standard, sheddable; the KServe classes map onto them by
    ``PRIORITY_BANDS``: guaranteed is standard, best-effort sheddable) and fairness across
    tenants within a band. headrace's token-level router holds generative requests by it."""

    queue: QueueLimits = Field(default_factory=QueueLimits, description="held requests per band")
    fairness: Literal["vtc", "none"] = Field(
        default="vtc", description="vtc: within a band, the tenant served the fewest tokens goes first (Virtual "
        "Token Counter); none: earliest TTFT deadline first across the band")


class GatewaySettings(Strict):
    """What the gateway is configured with besides its models (``headrace serve`` YAML's top level)."""

    listen: ListenConfig = Field(default_factory=ListenConfig, description="where clients connect")
    health_interval_s: float = Field(default=0.5, gt=0, le=60, description="replica ready-probe period")
    startup_timeout_s: float = Field(default=30.0, gt=0, le=600, description="wait for replicas' metadata")
    drain_timeout_s: float = Field(default=30.0, ge=0, le=600, description="SIGTERM: wait for in-flight")
    max_message_bytes: int = Field(default=64 << 20, ge=1024, le=2**31 - 1,
                                   description="largest request/response body")
    scheduler: dict[str, Any] = Field(default_factory=dict,
                                      description="policy core settings (headrace explain Scheduler)")
    limits: LimitsSpec = Field(default_factory=LimitsSpec, description="what the front door accepts")
    expose_replicas: bool = Field(default=False, description="debug: answers name the replica that served "
                                  "them (headrace_replica: its id); off, they do not. Errors, headers and "
                                  "/metrics name replicas by id, never by address")
    tls: TlsSpec | None = Field(default=None, description="TLS on the HTTP and gRPC listeners (plain text "
                                "when absent); with client_ca_file, mutual TLS")
    tenants: list[TenantSpec] = Field(default_factory=list, max_length=10_000,
                                      description="API-key tenants; when any is set, every call but the health "
                                      "probes needs a key (Authorization: Bearer KEY or x-api-key: KEY), and "
                                      "/metrics on the main port a key of a tenant with metrics: true")
    metrics_listen: ListenAddress | None = Field(default=None, description="serve /metrics (and the health "
                                                 "probes) on this plain-HTTP address without a key, and not "
                                                 "on the main port: for the scraper, bound where tenants "
                                                 "cannot reach it")
    access_log: AccessLogSpec = Field(default_factory=AccessLogSpec,
                                      description="structured access logs (JSON lines; off by default)")
    tracing: TracingSpec = Field(default_factory=TracingSpec,
                                 description="OpenTelemetry tracing (off by default)")
    flow_control: FlowControlSpec = Field(default_factory=FlowControlSpec,
                                          description="requests held until a replica should take them: queue "
                                          "limits per priority band, fairness across tenants")

    @model_validator(mode="after")
    def _tenants(self) -> GatewaySettings:
        names = [t.name for t in self.tenants]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"tenant names must be unique, got {dup} more than once")
        return self

    def listeners(self) -> list[tuple[str, str, int]]:
        """(field path, host, port) of every address this document binds."""
        out = [("listen.http_port", self.listen.host, self.listen.http_port),
               ("listen.grpc_port", self.listen.host, self.listen.grpc_port)]
        if self.metrics_listen is not None:
            out.append(("metrics_listen.port", self.metrics_listen.host, self.metrics_listen.port))
        return out

    @model_validator(mode="after")
    def _ports(self) -> GatewaySettings:
        # two listeners on one port fail to bind at start, after replicas have started: caught here
        seen: list[tuple[str, str, int]] = []
        for name, host, port in self.listeners():
            other = next((o for o, h, p in seen if p == port and port != 0 and _same_address(h, host)), None)
            if other is not None:
                raise ValueError(f"{name} ({port}) is also {other} on {host}: every listener needs its own "
                                 "port (0: any free)")
            seen.append((name, host, port))
        return self


def _same_address(a: str, b: str) -> bool:
    """Whether binding both hosts on one port clashes: the same address, ``localhost`` and a
    loopback address, or either one every address (``::`` is every IPv4 address too; ``0.0.0.0``
    no IPv6 one)."""
    if a == b or {a, b} in ({"localhost", "127.0.0.1"}, {"localhost", "::1"}):
        return True
    for wild, other in ((a, b), (b, a)):
        if wild == "::" or (wild == "0.0.0.0" and ":" not in other):  # noqa: S104  (compared, not bound)
            return True
    return False


class AdminSpec(Strict):
    host: Host = Field(default="127.0.0.1", description="address of the operator's admin API")
    port: Port = Field(default=0, description="admin API port (0: any free)")
    token_env: str = Field(default="HEADRACE_ADMIN_TOKEN", min_length=1,
                           description="environment variable holding the admin token")
    token_file: str | None = Field(default=None, description="file holding the admin token "
                                   "(default: generated into the state directory)")
    tls: CertificateSpec | None = Field(default=None, description="serve the admin API over HTTPS, the bearer "
                                        "token still required (clients verify it with --admin-ca or "
                                        "$HEADRACE_ADMIN_CA)")


class GatewaySpec(GatewaySettings):
    admin: AdminSpec = Field(default_factory=AdminSpec, description="the operator's admin API")
    workers: int = Field(default=1, ge=1, le=64, description="gateway processes sharing the HTTP and gRPC "
                         "ports (SO_REUSEPORT), each batching for its own replicas of every classic model, "
                         "so each such model is planned at least this many replicas (on any GPUs); each "
                         "worker's /metrics is on metrics_listen.port + its index (docs/scaleout.md)")

    def listeners(self) -> list[tuple[str, str, int]]:
        out = [*super().listeners(), ("admin.port", self.admin.host, self.admin.port)]
        m = self.metrics_listen
        if m is not None and m.port and self.workers > 1:
            out += [(f"metrics_listen.port of worker {i}", m.host, m.port + i) for i in range(1, self.workers)]
        return out

    @model_validator(mode="after")
    def _worker_ports(self) -> GatewaySpec:
        m = self.metrics_listen
        if m is not None and m.port and m.port + self.workers - 1 > 65535:
            raise ValueError(f"metrics_listen.port ({m.port}) + {self.workers} workers runs past port 65535")
        return self


class Gateway(_Document):
    kind: Literal["Gateway"] = Field(default="Gateway", description="document kind")
    spec: GatewaySpec = Field(default_factory=GatewaySpec)


KINDS: dict[str, type[Strict]] = {"GpuPool": GpuPool, "ModelDeployment": ModelDeployment, "Gateway": Gateway}


# --------------------------------------------------------------------------- loading


@dataclass
class Documents:
    """Every document of a set of files, by kind, each with where it came from."""

    pools: list[GpuPool] = field(default_factory=list)
    deployments: list[ModelDeployment] = field(default_factory=list)
    gateways: list[Gateway] = field(default_factory=list)
    where: dict[int, str] = field(default_factory=dict)  # id(document) -> "file document i"
    base_dir: dict[int, Path] = field(default_factory=dict)  # id(document) -> its file's folder

    def origin(self, doc: object) -> str:
        return self.where.get(id(doc), "(document)")


def _union_tag(part: str) -> bool:
    """A location part naming the union member pydantic tried (``str``, ``constrained-str``,
    ``VariantSpec``), not a field."""
    return part in ("str", "VariantSpec") or part.endswith("-str") or part.startswith(("function-", "str["))


def format_error(err: ValidationError, where: str, prefix: tuple[str, ...] = ()) -> str:
    """One line: where, then each failing field path (below ``prefix``) with its message and the
    value given."""
    errors = [(prefix + tuple(str(x) for x in e["loc"] if not _union_tag(str(x))), e)
              for e in err.errors()]
    # a union member that got further (a deeper path) explains the error; the others are noise
    errors = [(p, e) for p, e in errors if not any(len(q) > len(p) and q[:len(p)] == p for q, _ in errors)]
    parts = []
    for path, e in errors:
        loc = ".".join(path) or "(document)"
        msg = e["msg"].removeprefix("Value error, ")
        # a missing field has no value; a whole-object check quotes its values in its message
        quiet = e["type"] == "missing" or (e["type"] == "value_error" and isinstance(e.get("input"), dict))
        parts.append(f"{loc}: {msg}" if quiet else f"{loc}: {msg} (got {e.get('input')!r})")
    return f"{where}: " + "; ".join(dict.fromkeys(parts))


def yaml_files(paths: list[str | Path] | tuple[str | Path, ...]) -> list[Path]:
    """The files named, a folder standing for its *.yaml / *.yml files in name order."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(x for x in p.iterdir() if x.suffix in (".yaml", ".yml"))
        else:
            out.append(p)
    return out


def yaml_documents(text: str, where: str) -> list[Any]:
    """The documents of one YAML stream (empty ones dropped), parsed as they are; a stream that
    does not parse is a :class:`SpecError` naming ``where`` and the line."""
    try:
        try:  # libyaml where PyYAML has it (a fleet's documents); its errors are worded by the pure loader
            return [d for d in yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if d is not None]
        except yaml.YAMLError:
            return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        ctx = f" ({e.context} at line {e.context_mark.line + 1})" if e.context and e.context_mark else ""
        raise SpecError(f"{where}: {at}not valid YAML: {e.problem}{ctx}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{where}: not valid YAML: {' '.join(str(e).split())}") from None


def add_documents(raw: list[Any], where: str, docs: Documents, base_dir: Path | None = None) -> None:
    """Validate parsed documents (:func:`yaml_documents`) into ``docs``; an error names
    ``where``, the document's index, the field and the value."""
    sinks = {"GpuPool": docs.pools, "ModelDeployment": docs.deployments, "Gateway": docs.gateways}
    for i, d in enumerate(raw):
        here = f"{where} document {i}"
        if not isinstance(d, dict) or d.get("kind") not in KINDS:
            got = d.get("kind") if isinstance(d, dict) else type(d).__name__
            raise SpecError(f"{here}: kind: must be one of {', '.join(KINDS)} (got {got!r})")
        try:
            obj = KINDS[d["kind"]].model_validate(d)
        except ValidationError as e:
            raise SpecError(format_error(e, here)) from None
        sinks[d["kind"]].append(obj)
        docs.where[id(obj)] = here
        if base_dir is not None:
            docs.base_dir[id(obj)] = base_dir


def parse_documents(text: str, where: str, docs: Documents, base_dir: Path | None = None) -> None:
    """Validate every document of one YAML stream into ``docs``."""
    add_documents(yaml_documents(text, where), where, docs, base_dir)


def load_documents(*paths: str | Path) -> Documents:
    """Read every document of the given YAML files or folders."""
    docs = Documents()
    for path in yaml_files(paths):
        try:
            text = path.read_text()
        except OSError as e:
            raise SpecError(f"{path}: cannot read: {e.strerror}") from None
        parse_documents(text, str(path), docs, path.parent.resolve())
    return docs


def json_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of one kind (``headrace explain KIND --schema``)."""
    if kind not in KINDS:
        raise SpecError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
    return KINDS[kind].model_json_schema()


def dump_json_schemas(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind in KINDS:
        p = out_dir / f"{kind}.schema.json"
        p.write_text(json.dumps(json_schema(kind), indent=2) + "\n")
        paths.append(p)
    return paths
