"""What a request asks beyond its tensors: of the gateway (its deadline and priority class)
and of Triton (what Triton must receive).

Triton sees what the client sent, minus what the gateway itself consumes, plus ``timeout``:

- consumed: ``timeout`` and ``priority`` (the gateway schedules by them and sends its own
  ``timeout``: the request's remaining budget), ``binary_data_output`` (how the gateway's
  own answer is encoded; it always asks Triton for binary outputs) and every ``headrace_*``
  parameter (the gateway's own: variant constraints and the like);
- forwarded: every other request parameter (``sequence_id``, ``sequence_start`` and
  ``sequence_end`` included), the requested outputs with their parameters (``classification``
  among them; an output's HTTP ``binary_data`` flag is only about the gateway's answer), and a
  version the client named.

A batch goes to Triton as one request, so requests share a batch only when all of that is
alike: :func:`forward_of` gives the batch key the core groups by (None in the common case of
nothing to forward). A request asking for every output, with no output parameter, asks for
the same as one asking for none, and batches with it.

What crosses members is Triton's ``timeout``: the batch's is its longest member's budget. So
no member may make it something Triton cannot take. A budget is at most :data:`MAX_BUDGET_S`
(3600 s, the SLO header's bound too: a larger ``timeout`` parameter is clamped to it), and
:func:`timeout_us` stays in [1, 3.6e9] µs. Triton reads ``timeout`` as an int64 (gRPC
``int64_param``) or uint64 (HTTP) of µs and adds ``timeout * 1000`` to a steady-clock
nanosecond count in a uint64 (triton-inference-server/core ``src/scheduler_utils.cc``,
``PriorityQueue::PolicyQueue::Enqueue``): a huge value overflows there or, over gRPC, cannot
be encoded at all, and either fails every member of the batch.

A forwarded value is refused (:class:`InvalidRequest`, 400 / INVALID_ARGUMENT) where Triton
would refuse it, before it can fail a batch, following Triton 2.51
(triton-inference-server/server ``src/grpc/infer_handler.cc`` ``SetInferenceRequestMetadata``,
``src/grpc/grpc_utils.cc`` ``ParseClassificationParams``, ``src/http_server.cc``
``SetTritonParameterFromJsonParameter``), taking the stricter of its HTTP and gRPC rules so any
replica accepts it: a value is a boolean, a string, a finite number or an integer within int64;
``sequence_start`` and ``sequence_end`` are booleans; ``sequence_id`` a non-negative int64 or a
string; an output's ``classification`` an integer >= 1. Shared-memory parameters
(:data:`~gateway.codec.SHM_PARAMS`) are refused wherever they appear: the gateway does not
offer the shared-memory extension, and Triton would read or write a region another client
registered.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from gateway.codec import SHM_PARAMS, InferInput, Signature
from gateway.errors import InvalidRequest
from gateway.policy.types import Priority

SLO_HEADER = "x-headrace-slo-ms"  # the request's SLO in ms (header / gRPC metadata)
# variant constraints: request parameters, or these headers / gRPC metadata (parameters win)
MIN_ACCURACY, MAX_COST, PIN = "headrace_min_accuracy", "headrace_max_cost", "headrace_variant"
CHOICE_HEADERS = {"x-headrace-min-accuracy": MIN_ACCURACY, "x-headrace-max-cost": MAX_COST,
                  "x-headrace-variant": PIN}
CONSUMED = frozenset({"timeout", "priority", "binary_data_output"})
GATEWAY_PREFIX = "headrace_"
SEQUENCE_PARAMS = ("sequence_id", "sequence_start", "sequence_end")
MAX_BUDGET_S = 3600.0  # the longest budget a request gets: SLO header, timeout parameter and Triton's timeout
INT64_MAX = (1 << 63) - 1  # gRPC int64_param: the widest integer every Triton front end takes

Params = tuple[tuple[str, Any], ...]  # sorted (name, value) pairs


@dataclass(frozen=True, slots=True)
class Forward:
    """What goes to Triton with a batch besides its tensors (and ``timeout``)."""

    version: str = ""  # "" = Triton's default
    parameters: Params = ()
    outputs: tuple[tuple[str, Params], ...] = ()  # () = every output


@dataclass(frozen=True, slots=True)
class Sequence:
    id: Hashable
    start: bool
    end: bool


def _scalar(where: str, v: Any) -> Any:
    if isinstance(v, bool | str):
        return v
    if isinstance(v, int):
        if -INT64_MAX - 1 <= v <= INT64_MAX:
            return v
        raise InvalidRequest(f"{where} {v} is out of range (a 64-bit signed integer)")
    if isinstance(v, float):
        if math.isfinite(v):
            return v
        raise InvalidRequest(f"{where} {v!r} must be a finite number")
    raise InvalidRequest(f"{where} must be a string, number or boolean, got {type(v).__name__}")


def _params(where: str, params: dict[str, Any], skip: bool) -> Params:
    out = []
    for k, v in params.items():
        if skip and (k in CONSUMED or k.startswith(GATEWAY_PREFIX)):
            continue
        if k in SHM_PARAMS:
            raise InvalidRequest(f"{where} {k!r}: shared memory is not offered by this server")
        out.append((k, _scalar(f"{where} {k!r}", v)))
    return tuple(sorted(out))


def _check_request(params: Params) -> None:
    """Triton's rules for the request parameters it reads itself (see the module doc)."""
    for k, v in params:
        if k in ("sequence_start", "sequence_end") and not isinstance(v, bool):
            raise InvalidRequest(f"parameter {k} {v!r} must be a boolean")


def _check_output(name: str, params: Params) -> None:
    for k, v in params:
        if k == "classification" and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise InvalidRequest(f"output {name!r} parameter 'classification' {v!r} must be an integer >= 1")


def forward_of(inp: InferInput, version: str, sig: Signature) -> Forward | None:
    """What ``inp`` forwards to Triton (its batch key), or None when nothing is."""
    params = _params("parameter", inp.parameters, skip=True) if inp.parameters else ()
    if params:
        _check_request(params)
    outputs: tuple[tuple[str, Params], ...] = ()
    if inp.outputs:
        outputs = tuple(sorted((o.name, _params(f"output {o.name!r} parameter", o.parameters, skip=False))
                               for o in inp.outputs))
        for name, p in outputs:
            if p:
                _check_output(name, p)
        if all(not p for _, p in outputs) and {n for n, _ in outputs} == set(sig.outputs):
            outputs = ()  # every output, nothing asked of them: the same as asking for none
    if not (params or outputs or version):
        return None
    return Forward(version, params, outputs)


def sequence_of(inp: InferInput) -> Sequence | None:
    """The sequence ``inp`` belongs to (Triton's ``sequence_id``; 0 or "" is none)."""
    p = inp.parameters
    sid = p.get("sequence_id") if p else None
    if sid is None or sid == 0 or sid == "":
        return None
    if isinstance(sid, bool) or not isinstance(sid, int | str) or (isinstance(sid, int) and not 0 <= sid <= INT64_MAX):
        raise InvalidRequest(f"parameter sequence_id {sid!r} must be a non-negative 64-bit integer or a string")
    flags = []
    for name in ("sequence_start", "sequence_end"):
        v = p.get(name, False)
        if not isinstance(v, bool):
            raise InvalidRequest(f"parameter {name} {v!r} must be a boolean")
        flags.append(v)
    return Sequence(sid, *flags)


@dataclass(frozen=True, slots=True)
class Choice:
    """A request's constraints on the variant that serves it."""

    accuracy_floor: float | None = None  # least accuracy, in [0, 1]
    max_cost: float | None = None  # highest price of its answer, $ (given per 1,000 answers)
    variant: str | None = None  # only this variant


def choice_headers(headers: Any) -> dict[str, str] | None:
    """The variant-constraint headers among ``headers`` (name, value pairs or a mapping with
    lower-case names), keyed by their parameter names; None when there are none."""
    out: dict[str, str] = {}
    if hasattr(headers, "get"):  # a mapping (HTTP): three lookups, whatever else it holds
        for name, param in CHOICE_HEADERS.items():
            v = headers.get(name)
            if v is not None:
                out[param] = v
        return out or None
    for k, v in headers:  # name, value pairs (gRPC metadata)
        if k in CHOICE_HEADERS:
            out[CHOICE_HEADERS[k]] = v if isinstance(v, str) else v.decode()
    return out or None


def _number(name: str, v: Any, low: float, high: float) -> float:
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise InvalidRequest(f"{name} {v!r} is not a number") from None
    if isinstance(v, bool) or not isinstance(v, int | float) or not low <= v <= high:
        raise InvalidRequest(f"{name} {v!r} must be a number in [{low:g}, {high:g}]")
    return float(v)


def choice_of(params: dict[str, Any], hints: dict[str, str] | None) -> Choice | None:
    """The constraints ``params`` (request parameters) and ``hints`` (:func:`choice_headers`)
    give; None when neither gives any. :class:`InvalidRequest` for a malformed one."""
    got = {**(hints or {}), **{k: v for k, v in params.items() if k in (MIN_ACCURACY, MAX_COST, PIN)}}
    if not got:
        return None
    floor = got.get(MIN_ACCURACY)
    cap = got.get(MAX_COST)
    pin = got.get(PIN)
    if pin is not None and (not isinstance(pin, str) or not pin):
        raise InvalidRequest(f"{PIN} {pin!r} must be a variant name")
    return Choice(None if floor is None else _number(MIN_ACCURACY, floor, 0.0, 1.0),
                  None if cap is None else _number(MAX_COST, cap, 0.0, 1e9) / 1000.0, pin)


def timeout_us(remaining_s: float) -> int:
    """Triton's ``timeout`` (µs) for ``remaining_s`` seconds of budget: at least 1 (Triton
    reads 0 as "no timeout"), at most :data:`MAX_BUDGET_S` (whatever ``remaining_s`` is)."""
    if not remaining_s < MAX_BUDGET_S:  # NaN and inf too
        remaining_s = MAX_BUDGET_S
    return max(1, int(remaining_s * 1e6))


def deadline_of(inp: InferInput, slo_header: str | None, default_slo: float, now: float,
                margin: float = 0.0, client_deadline: float | None = None) -> float:
    """Triton's ``timeout`` parameter (µs) first, then the SLO header (ms), then the model's SLO,
    capped by the seconds the client itself still waits (``client_deadline``: a gRPC deadline).
    The core plans toward ``1 - margin`` of that budget: the rest is kept for what happens
    outside the gateway's view (the client's send, the network, the answer's way back)."""
    budget = _budget(inp, slo_header, default_slo)
    if client_deadline is not None:
        budget = min(budget, max(0.0, client_deadline))
    return now + budget * (1.0 - margin)


def _budget(inp: InferInput, slo_header: str | None, default_slo: float) -> float:
    t = inp.parameters.get("timeout")
    if t is not None:
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise InvalidRequest(f"parameter timeout {t!r} must be a non-negative integer (microseconds)")
        if t > 0:
            return min(t / 1e6, MAX_BUDGET_S)  # Triton takes any uint64: clamped, not refused
    if slo_header:
        try:
            ms = float(slo_header)
        except ValueError:
            raise InvalidRequest(f"{SLO_HEADER} {slo_header!r} is not a number of milliseconds") from None
        if not 0 < ms <= MAX_BUDGET_S * 1e3:
            raise InvalidRequest(f"{SLO_HEADER} ({ms:g}) must be in (0, {MAX_BUDGET_S * 1e3:.0f}] milliseconds")
        return ms / 1e3
    return default_slo


def priority_of(inp: InferInput, default: Priority) -> Priority:
    """Triton's ``priority``: 0 (default) and 1 are guaranteed, 2 and above best-effort."""
    p = inp.parameters.get("priority")
    if p is None:
        return default
    if not isinstance(p, int) or isinstance(p, bool) or p < 0:
        raise InvalidRequest(f"parameter priority {p!r} must be a non-negative integer")
    if p == 0:
        return default
    return Priority.GUARANTEED if p == 1 else Priority.BEST_EFFORT
