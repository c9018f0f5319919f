"""The live load step of bench.variants: 0.5x -> 4x -> 0.5x of one ViT-B/16 slice, open loop,
from tritonclient's asyncio HTTP client, latency counted from each request's scheduled send.

Every request carries an id, so the gateway's access log line of each answer (its own
``total_ms`` from reading the request to answering it, ``queue_ms``, the variant, a refusal's
reason) joins the client's view. A miss is then one of:

- ``refused``: the gateway answered 429/503 (its reason says which rule);
- ``late_in_gateway``: answered OK, but the gateway itself took longer than the SLO;
- ``late_outside``: the gateway answered within the SLO, the client saw it late (its own send
  lag, the loopback, parsing the answer: the machine's client, not the gateway's policy);
- ``error``: anything else (no answer, a transport error).

Triton's own statistics (per Triton model: executions, rows, queue and compute time) are read
before and after each run. The same schedule is driven at a system with no variant choice and
ample capacity at 4x (two ResNet-50 slices), interleaved with headrace's runs, so the two
differ by what variant choice costs and share whatever this 2-core machine adds.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http.aio as aiohttpclient
from tritonclient.utils import InferenceServerException

STEP = ((0.5, 10.0), (4.0, 10.0), (0.5, 10.0))  # (x ViT capacity, seconds): the load step
STEP_WINDOW_S = 1.0
TRANSITION_S = 4.0  # after each step: two hysteresis windows (2 x the default dwell, 2 s)
CLIENT_LAG_S = 0.010  # a request the client sent later than this after its schedule: the client stalled


@dataclass(frozen=True, slots=True)
class Sent:
    """One request of the step as the client saw it (seconds from the run's start)."""

    at: float  # scheduled send
    lag: float  # the client's own delay before sending
    latency: float | None  # answer time less ``at`` (None: no answer)
    variant: str | None  # Triton model that served it (None: not served)
    status: int | None  # HTTP status of a refusal (None: served, or no status)


def schedule(cap: float, phases: Sequence[tuple[float, float]], seed: int) -> list[float]:
    """Poisson send times at each phase's multiple of ``cap`` req/s, phase after phase."""
    rng = np.random.default_rng(seed)
    out: list[float] = []
    t0 = 0.0
    for load, seconds in phases:
        t = t0
        while True:
            t += rng.exponential(1 / (load * cap))
            if t >= t0 + seconds:
                break
            out.append(t)
        t0 += seconds
    return out


async def drive(client: aiohttpclient.InferenceServerClient, x: aiohttpclient.InferInput,
                sched: list[float], prefix: str, params: Sequence[dict[str, Any] | None] | None = None) -> list[Sent]:
    """Send request ``i`` (id ``prefix + i``, request parameters ``params[i]``) at ``sched[i]``;
    every request is answered or counted."""
    out: list[Sent | None] = [None] * len(sched)

    async def one(i: int, at: float, start: float) -> None:
        lag = time.monotonic() - start - at
        try:
            r = await client.infer("imagenet", [x], request_id=f"{prefix}{i}",
                                   parameters=params[i] if params is not None else None)
            out[i] = Sent(at, lag, time.monotonic() - start - at,
                          r.get_response()["parameters"]["headrace_variant"], None)
        except InferenceServerException as e:
            status = e.status()
            out[i] = Sent(at, lag, time.monotonic() - start - at, None,
                          int(status) if status and str(status).isdigit() else None)
        except Exception:  # noqa: BLE001  (a transport error: counted as not answered)
            out[i] = Sent(at, lag, None, None, None)

    start = time.monotonic()
    tasks = []
    for i, at in enumerate(sched):
        delay = start + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, at, start)))
    await asyncio.gather(*tasks)
    return [s for s in out if s is not None]


def read_access_log(path: Path, prefix: str) -> dict[int, dict[str, Any]]:
    """The gateway's access log lines of one run, by request index."""
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            d = json.loads(line)
            rid = d.get("request_id") or ""
            if rid.startswith(prefix):
                out[int(rid[len(prefix):])] = d
    return out


def triton_stats(triton_http: str) -> dict[str, dict[str, float]]:
    """Per Triton model: executions, rows inferred, and total queue and compute-infer seconds."""
    doc = json.loads(urllib.request.urlopen(f"http://{triton_http}/v2/models/stats", timeout=10).read())
    out = {}
    for m in doc.get("model_stats", []):
        s = m.get("inference_stats", {})
        out[m["name"]] = {"executions": float(m.get("execution_count", 0)),
                          "rows": float(m.get("inference_count", 0)),
                          "queue_s": float(s.get("queue", {}).get("ns", 0)) / 1e9,
                          "compute_s": float(s.get("compute_infer", {}).get("ns", 0)) / 1e9}
    return out


def triton_delta(before: dict, after: dict) -> dict[str, dict[str, float]]:
    """What each Triton model did between two :func:`triton_stats` readings (busy ones only):
    executions, rows and compute seconds in all, and per execution."""
    out = {}
    for name, a in after.items():
        b = before.get(name, {})
        d = {k: v - b.get(k, 0.0) for k, v in a.items()}
        if d["executions"] > 0:
            out[name] = {"executions": d["executions"], "rows": d["rows"], "compute_s": d["compute_s"],
                         "rows_per_batch": d["rows"] / d["executions"],
                         "queue_ms_per_batch": d["queue_s"] / d["executions"] * 1e3,
                         "compute_ms_per_batch": d["compute_s"] / d["executions"] * 1e3}
    return out


def _pct(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def kind(s: Sent, line: dict[str, Any] | None, slo: float) -> str:
    """``ok``, or why a request missed (see the module docstring)."""
    if s.variant is not None and s.latency is not None and s.latency <= slo:
        return "ok"
    if s.status is not None:
        return "refused"
    if s.variant is None:
        return "error"
    if line is not None and line.get("total_ms") is not None and line["total_ms"] <= slo * 1e3:
        return "late_outside"
    return "late_in_gateway"


def summarise(sents: list[Sent], log: dict[int, dict[str, Any]], phases: Sequence[tuple[float, float]],
              accuracy: dict[str, float], slo: float) -> dict[str, Any]:
    """Per window and over the steady parts (outside the transition after each step):
    attainment, mean accuracy, the client's send lag, and the misses by kind and variant."""
    kinds = [kind(s, log.get(i), slo) for i, s in enumerate(sents)]
    end = sum(sec for _, sec in phases)
    edges = [sum(sec for _, sec in phases[:k + 1]) for k in range(len(phases) - 1)]
    windows = []
    for w in range(int(end / STEP_WINDOW_S)):
        idx = [i for i, s in enumerate(sents) if w * STEP_WINDOW_S <= s.at < (w + 1) * STEP_WINDOW_S]
        served = [accuracy[sents[i].variant] for i in idx if sents[i].variant is not None]
        windows.append({"t": w * STEP_WINDOW_S, "offered": len(idx),
                        "attainment": sum(kinds[i] == "ok" for i in idx) / len(idx) if idx else None,
                        "mean_accuracy": sum(served) / len(served) if served else None,
                        "send_lag_p99_ms": (_pct([sents[i].lag for i in idx], 0.99) or 0.0) * 1e3 if idx else None,
                        "misses": dict(Counter(kinds[i] for i in idx if kinds[i] != "ok"))})
    steady = [i for i, s in enumerate(sents) if not any(e <= s.at < e + TRANSITION_S for e in edges)]
    prompt = [i for i in steady if sents[i].lag <= CLIENT_LAG_S]
    # the high phase outside its transition: where the misses are
    high = [i for i in steady if edges and edges[0] + TRANSITION_S <= sents[i].at < (edges[1] if len(edges) > 1 else end)]
    by_variant: dict[str, dict[str, Any]] = {}
    for i in high:
        line = log.get(i) or {}
        v = sents[i].variant or line.get("variant") or "-"
        d = by_variant.setdefault(v, {"requests": 0, "misses": Counter(), "total_ms": [], "client_ms": []})
        d["requests"] += 1
        if kinds[i] != "ok":
            d["misses"][kinds[i]] += 1
        if line.get("total_ms") is not None and sents[i].variant is not None:
            d["total_ms"].append(line["total_ms"])
        if sents[i].latency is not None and sents[i].variant is not None:
            d["client_ms"].append(sents[i].latency * 1e3)
    for d in by_variant.values():
        tm, cm = d.pop("total_ms"), d.pop("client_ms")
        d["misses"] = dict(d["misses"])
        d.update(gateway_ms_p50=_pct(tm, 0.5), gateway_ms_p99=_pct(tm, 0.99),
                 client_ms_p50=_pct(cm, 0.5), client_ms_p99=_pct(cm, 0.99))
    reasons = Counter((log.get(i) or {}).get("reason") or str(sents[i].status) for i in steady if kinds[i] == "refused")
    last = [accuracy[s.variant] for s in sents if s.at >= end - 3.0 and s.variant is not None]
    return {"requests": len(sents), "windows": windows, "steady_requests": len(steady), "steady_prompt": len(prompt),
            "steady_attainment": sum(kinds[i] == "ok" for i in steady) / len(steady) if steady else None,
            "client_late": len(steady) - len(prompt),
            "steady_attainment_sent_on_time": sum(kinds[i] == "ok" for i in prompt) / len(prompt) if prompt else None,
            "steady_misses": dict(Counter(kinds[i] for i in steady if kinds[i] != "ok")),
            "refusal_reasons": dict(reasons), "high_by_variant": by_variant,
            "access_log_lines": sum(i in log for i in range(len(sents))),
            "final_mean_accuracy": sum(last) / len(last) if last else None}
