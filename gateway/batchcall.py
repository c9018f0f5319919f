"""One batch's call to Triton: its requests grouped by their non-batch shapes (one Triton
request per group), the call's bound and Triton's ``timeout``, and the answers cut back into
each request's outputs (a batch's answer must carry exactly its rows, else the batch fails)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import grpc

from gateway.codec import Tensor, concat, split
from gateway.contract import timeout_us
from gateway.errors import BackendError, InvalidRequest, Unavailable
from gateway.fleet import Model, Replica
from gateway.hedge import LATE_S
from gateway.policy.types import Batch


def send_batch(rep: Replica, b: Batch, live: list[Any], now: float, model: Model | None,
               bt: Any = None, *, max_bytes: int) -> Awaitable[list[list[Tensor]]]:
    """Start one Triton request per group of ``live`` (the driver's pending records of the
    batch's members) whose non-batch shapes agree, each of at most ``max_bytes`` of inputs
    (``max_message_bytes``: what a gRPC replica takes; a member alone may hold as much); the
    awaitable gives each request's outputs (or raises what went wrong, sending included).
    ``model``: the served model (its margin and signature); ``bt``: the batch's spans (tracing
    on), which send each call with its trace context."""
    try:
        if not live:
            return _value([])
        if model is None or model.info is None:
            raise Unavailable(f"model '{b.requests[0].model}' is no longer served")
        # Triton's timeout: what is left of the latest member's whole budget (margin included)
        keep = 1.0 - model.served.margin
        budget = max(r.arrival + (r.deadline - r.arrival) / keep for r in (p.request for p in live))
        forward, triton_us = live[0].forward, timeout_us(budget - now)
        # the call's own bound: as long as its latest member waits (gateway.hedge)
        timeout = max(0.0, budget - now) + LATE_S
        groups: dict[tuple, list[int]] = {}
        if len(live) == 1:  # one request is one group: no shape keys to compute
            groups[()] = [0]
        else:
            sizes: dict[tuple, int] = {}
            for i, p in enumerate(live):
                key = tuple((t.name, tuple(t.shape[1:])) for t in sorted(p.input.inputs, key=lambda t: t.name))
                n = p.nbytes
                if sizes.get(key, 0) + n > max_bytes and key in groups:  # full: its next members start another call
                    groups[(len(groups), *key)] = groups.pop(key)
                    sizes[key] = 0
                groups.setdefault(key, []).append(i)
                sizes[key] = sizes.get(key, 0) + n
        inputs = [_group_inputs([live[i] for i in idx]) for idx in groups.values()]
        calls = ([rep.client.infer(b.variant, x, timeout, forward, triton_us) for x in inputs] if bt is None
                 else bt.calls(rep.client, b.variant, inputs, timeout, forward, triton_us))
    except Exception as e:  # noqa: BLE001  (answered as the batch's failure)
        return _raising(e)
    return _collect(rep, live, list(groups.values()), calls, model.info.signature.batched)


async def _collect(rep: Replica, live: list[Any], groups: list[list[int]],
                   calls: list[Awaitable[list[Tensor]]], batched: bool) -> list[list[Tensor]]:
    """Each group's answer, cut back into its requests' outputs."""
    answers = [await calls[0]] if len(calls) == 1 else await asyncio.gather(*calls)
    results: list[list[Tensor]] = [[] for _ in live]
    for idx, outs in zip(groups, answers, strict=True):
        rows = [live[i].request.size for i in idx]
        if batched:
            _check_rows(rep.id, outs, sum(rows))
        parts = [split(o, rows) for o in outs] if batched else [[o] for o in outs]
        for k, i in enumerate(idx):
            results[i] = [ps[k] for ps in parts]
    return results


def _check_rows(replica: str, outs: list[Tensor], rows: int) -> None:
    """A batch's answer must carry exactly its rows, else the whole batch fails."""
    for o in outs:
        if not o.shape or o.shape[0] != rows:
            raise BackendError(
                f"replica {replica}: output '{o.name}' has shape {o.shape}, expected {rows} rows "
                "for the batch", grpc.StatusCode.INTERNAL, retryable=False)


def _group_inputs(members: list[Any]) -> list[Tensor]:
    """The inputs of requests that agree on shapes, stacked along the batch dimension."""
    if len(members) == 1:
        return members[0].input.inputs
    names = [t.name for t in members[0].input.inputs]
    return [concat([_by_name(p.input.inputs, n) for p in members]) for n in names]


async def _value(v: Any) -> Any:
    return v


async def _raising(e: Exception) -> Any:
    raise e


def _by_name(tensors: list[Tensor], name: str) -> Tensor:
    for t in tensors:
        if t.name == name:
            return t
    raise InvalidRequest(f"input '{name}' is missing")
