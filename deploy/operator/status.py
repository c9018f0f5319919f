"""``headrace status``: per deployment, its conditions (Ready / Progressing / Degraded, each with
reason, message and observedGeneration), replicas per variant and slice, planned capacity
against the observed rate, and attainment over the last minute, read from the gateway; and the
same status printed as tables."""

from __future__ import annotations

import datetime
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from placement.diff import replica_ids
from placement.plan import FloorShortfall

if TYPE_CHECKING:
    from rich.console import Console

    from deploy.operator.desired import Desired
    from deploy.operator.llm_runtime import LlmEngines
    from deploy.operator.observe import Observer
    from deploy.operator.runtime import ProcessRuntime
    from gateway.handle import GatewayHandle, Seen
    from placement.llm import LlmPlan
    from placement.plan import Plan
    from profiles.schema import ModelDeployment

RATE_WINDOW_S = 10.0
ATTAINMENT_WINDOW_S = 60.0


@dataclass
class Event:
    """Something the controller did to a deployment; status lists the latest."""

    time: float  # wall clock
    model: str
    kind: str  # Applied, ScaledUp, ScaledDown, Restarted, ...
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"time": rfc3339(self.time), "model": self.model, "kind": self.kind, "message": self.message}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Event:
        """An event as :meth:`to_dict` wrote it (the state directory's ``events.jsonl``)."""
        t = datetime.datetime.strptime(d["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.UTC)
        return cls(t.timestamp(), d.get("model", ""), d.get("kind", ""), d.get("message", ""))


def rfc3339(t: float) -> str:
    """``t`` (seconds since the epoch) as RFC 3339 UTC with milliseconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


class Observed(Protocol):
    """What :func:`status` reads of a controller; it records in ``transitions`` when each
    condition last changed."""

    clock: Callable[[], float]
    wall: Callable[[], float]
    desired: Desired | None
    plan: Plan | None
    llm_plan: LlmPlan
    runtime: ProcessRuntime | None
    engines: LlmEngines | None
    gateway: GatewayHandle | None
    seen: Seen
    observer: Observer
    generation: int
    observed_generation: int
    rates: dict[str, float]
    applying: str | None  # what the running apply is doing
    generations: dict[str, tuple[int, str]]  # deployment -> (its metadata.generation, digest of its spec)
    observed: dict[str, int]  # deployment -> the generation of it the running fleet serves
    failure: str | None  # why the last apply failed
    rolled_back: str | None  # why the last apply was rolled back
    restarting: dict[str, str]  # replica id -> why
    transitions: dict[tuple[str, str], tuple[bool, float]]  # (model, condition) -> (status, since)
    events: deque[Event]
    admin_url: str

    def serving(self) -> dict[str, tuple[int, bool]]:
        """Replica id -> (the gateway routing to it: 0 this controller's, i its actor i; whether
        that gateway finds it healthy)."""
        ...


def _condition(c: Observed, model: str, kind: str, ok: bool, reason: str, message: str,
               observed: int | None = None) -> dict[str, Any]:
    key = (model, kind)
    prev = c.transitions.get(key)
    if prev is None or prev[0] != ok:
        c.transitions[key] = (ok, c.wall())
    return {"type": kind, "status": "True" if ok else "False", "reason": reason, "message": message,
            "observedGeneration": c.observed_generation if observed is None else observed,
            "lastTransitionTime": rfc3339(c.transitions[key][1])}


def _replicas(c: Observed, model: str) -> list[dict[str, Any]]:
    out = []
    if c.plan is None:
        return out
    eps = c.runtime.endpoints() if c.runtime else {}
    served = c.serving()
    for g in c.plan.used():
        for s in g.slices:
            for r, rid in zip(s.replicas, replica_ids(g, s), strict=True):
                if r.model != model:
                    continue
                ep = eps.get(rid)
                out.append({
                    "id": rid, "variant": r.variant, "gpu": g.id, "gpu_model": g.gpu, "slice": s.label,
                    "share": r.share, "capacity_rps": round(r.capacity, 1),
                    "process": "running" if c.runtime and c.runtime.alive(rid) else
                               ("restarting" if rid in c.restarting else "down"),
                    "serving": served.get(rid, (0, False))[1],
                    "gateway": served[rid][0] if rid in served else None, "url": ep.http_url if ep else None,
                })
    return out


def _llm_replicas(c: Observed, model: str) -> list[dict[str, Any]]:
    urls = c.engines.urls() if c.engines else {}
    out = []
    for r in c.llm_plan.of(model):
        serving = c.seen.llm.get(r.id)
        out.append({
            "id": r.id, "variant": r.variant, "gpu": r.gpu, "gpu_model": r.profile.gpu, "slice": "gpu",
            "share": 1.0, "capacity_rps": 0.0,
            "process": "running" if c.engines and c.engines.alive(r.id) else
                       ("restarting" if r.id in c.restarting else "down"),
            "serving": bool(serving), "gateway": None if serving is None else 0,
            "url": urls.get(r.id),
        })
    return out


def llm_served(c: Observed, model: str) -> dict[str, Any]:
    """The gateway's counts of a generative model's answered requests since it started, and the
    share meeting its TTFT SLO, its TPOT SLO and both (None before the first)."""
    n: dict[str, float] = {"requests": 0.0, "ttft": 0.0, "tpot": 0.0, "both": 0.0}
    for name, labels, value in c.seen.counters:
        if labels.get("model") != model:
            continue
        if name == "headrace_llm_requests_total":
            n["requests"] += value
        elif name == "headrace_llm_slo_met_total" and labels.get("slo") in n:
            n[labels["slo"]] += value
    total = n["requests"]
    return {"requests": int(total), **{f"{k}_attainment": round(n[k] / total, 5) if total else None
                                       for k in ("ttft", "tpot", "both")}}


def _conditions(c: Observed, model: str, reps: list[dict[str, Any]], short: Any,
                floor: Any = None, observed: int | None = None, zero: bool = False) -> list[dict[str, Any]]:
    """``zero``: the deployment scaled to zero (min_replicas 0 and nothing to serve): Ready
    with no replica, as the next request starts one."""
    down = [r["id"] for r in reps if r["process"] != "running" or not r["serving"]]
    # a best-effort model an overfull pool placed short is Degraded (PoolOverfull) too, and so is
    # a replica floor the pool cannot meet on distinct GPUs (FloorUnmet; one short of nodes is not)
    if floor is not None and not floor.met and short is None:
        short = floor
    zero = zero and not reps
    return [
            _condition(c, model, "Ready", (bool(reps) or zero) and not down and c.failure is None,
                       "ScaledToZero" if zero else ("AllReplicasServing" if reps and not down else "ReplicasNotServing"),
                       "no replica: the next request starts one" if zero else
                       f"{len(reps) - len(down)}/{len(reps)} replicas serving", observed),
            _condition(c, model, "Progressing", c.applying is not None,
                       "Applying" if c.applying else ("RolledBack" if c.rolled_back else "Applied"),
                       c.applying or c.rolled_back or f"generation {c.observed_generation} applied", observed),
            _condition(c, model, "Degraded", bool(down) or c.failure is not None or short is not None,
                       "ApplyFailed" if c.failure else ("ReplicaDown" if down else
                                                        (_short_reason(short) if short else "AsPlanned")),
                       c.failure or (f"not serving: {', '.join(down)}" if down else
                                     (short.describe() if short else "every replica serving")), observed),
    ]


def _short_reason(short: Any) -> str:
    return "FloorUnmet" if isinstance(short, FloorShortfall) else "PoolOverfull"


def _llm_deployment(c: Observed, md: ModelDeployment, now: float) -> dict[str, Any]:
    s, llm = md.spec, md.spec.llm
    assert llm is not None
    ch = next((x for x in c.llm_plan.choices if x.model == s.model), None)
    reps = _llm_replicas(c, s.model)
    served = llm_served(c, s.model)
    rate = c.observer.window(s.model, RATE_WINDOW_S, now)
    att = c.observer.window(s.model, ATTAINMENT_WINDOW_S, now)
    return {
        "name": md.metadata.name, "model": s.model, "rate": s.rate, "planned_rate": s.rate, "slo_ms": s.slo_ms,
        "capacity_rps": round(s.rate * s.headroom, 1) if ch and ch.predicted is not None else 0.0,
        "observed_rps": round(rate.rate, 1),
        "attainment_1m": None if att.attainment is None else round(att.attainment, 5),
        "answered_1m": int(att.totals.answered), "refused_1m": int(att.totals.rejected),
        **_generations(c, md.metadata.name),
        "conditions": _conditions(c, s.model, reps, None, observed=c.observed.get(md.metadata.name)),
        "replicas": reps,
        "llm": {"variant": ch.profile.variant if ch else None, "slo_ttft_ms": s.slo_ms,
                "slo_tpot_ms": llm.slo_tpot_ms, "predicted_attainment": ch.predicted if ch else None, **served},
    }


def _generations(c: Observed, name: str) -> dict[str, Any]:
    """A deployment's own ``generation`` (its spec changed) and ``observedGeneration`` (that
    spec serves), as a Kubernetes object's ``metadata.generation`` and ``status.observedGeneration``."""
    return {"generation": c.generations.get(name, (0, ""))[0], "observedGeneration": c.observed.get(name, 0)}


def status(c: Observed) -> dict[str, Any]:
    now = c.clock()
    deployments = []
    for md in c.desired.docs.deployments if c.desired else []:
        if md.spec.llm is not None:
            deployments.append(_llm_deployment(c, md, now))
            continue
        model = md.spec.model
        reps = _replicas(c, model)
        short = next((sf for sf in c.plan.shortfall if sf.model == model), None) if c.plan else None
        floor = next((f for f in c.plan.floors if f.model == model), None) if c.plan else None
        zero = next((d.required == 0 for d in c.plan.demands if d.model == model), False) if c.plan else False
        conds = _conditions(c, model, reps, short, floor, c.observed.get(md.metadata.name), zero)
        rate = c.observer.window(model, RATE_WINDOW_S, now)
        att = c.observer.window(model, ATTAINMENT_WINDOW_S, now)
        deployments.append({
            "name": md.metadata.name, "model": model, **_generations(c, md.metadata.name), "rate": md.spec.rate,
            "planned_rate": c.rates.get(model, md.spec.rate), "slo_ms": md.spec.slo_ms,
            "capacity_rps": round(c.plan.capacity(model), 1) if c.plan else 0.0,
            "observed_rps": round(rate.rate, 1),
            "attainment_1m": None if att.attainment is None else round(att.attainment, 5),
            "answered_1m": int(att.totals.answered), "refused_1m": int(att.totals.rejected),
            "conditions": conds, "replicas": reps,
            **({"shortfall": short.to_dict()} if short is not None else {}),
            # the floor the plan was made for (spec.replicas or autoscaling.min_replicas)
            "min_replicas": next((d.min_replicas for d in c.plan.demands if d.model == model), 1) if c.plan else 1,
            **({"floor": {**floor.to_dict(), "message": floor.describe()}} if floor is not None else {}),
        })
    return {
        "generation": c.generation, "observedGeneration": c.observed_generation,
        "gateway": {"http": c.gateway.http_url, "grpc": c.gateway.grpc_url,
                    "workers": getattr(c.gateway, "n", 1)} if c.gateway else None,
        "admin": c.admin_url, "gpus": (c.plan.gpu_count if c.plan else 0) + len(c.llm_plan.gpus),
        "shortfall": [sf.to_dict() for sf in c.plan.shortfall] if c.plan else [],
        "floors": [{**f.to_dict(), "message": f.describe()} for f in c.plan.floors] if c.plan else [],
        "deployments": deployments, "events": [e.to_dict() for e in list(c.events)[-20:]],
    }


def changes(before: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """What changed from one status to the next, a line each: the fleet's generation, each
    deployment's conditions (type=status (reason): message) and the events since."""
    out = []
    if before is None or (before["generation"], before["observedGeneration"]) != (
            now["generation"], now["observedGeneration"]):
        out.append(f"generation {now['generation']} (observed {now['observedGeneration']})")
    was = {(d["name"], c["type"]): c for d in (before or {}).get("deployments", ()) for c in d["conditions"]}
    for d in now["deployments"]:
        for c in d["conditions"]:
            old = was.get((d["name"], c["type"]))
            if old is None or (old["status"], old["reason"], old["message"]) != (c["status"], c["reason"], c["message"]):
                out.append(f"{d['name']}: {c['type']}={c['status']} ({c['reason']}): {c['message']}")
    seen = {(e["time"], e["kind"], e["message"]) for e in (before or {}).get("events", ())}
    out += [f"{e['time']} {e['model'] or '-'} {e['kind']}: {e['message']}" for e in now["events"]
            if (e["time"], e["kind"], e["message"]) not in seen]
    return out


def print_endpoints(st: dict[str, Any], out: Console) -> None:
    """Where the gateway and the admin API listen, on one line."""
    gw = st.get("gateway") or {}
    workers = f" ({gw['workers']} workers)" if gw.get("workers", 1) > 1 else ""
    out.print(f"gateway{workers}: http {gw.get('http')}  grpc {gw.get('grpc')}  admin {st.get('admin')}",
              highlight=False)


def print_status(st: dict[str, Any], out: Console) -> None:
    """A status as tables: deployments, then replicas, then why any is Degraded."""
    from rich.table import Table  # noqa: PLC0415

    t = Table(title=f"generation {st['generation']} (observed {st['observedGeneration']}), {st['gpus']} GPUs")
    for col in ("deployment", "Ready", "Progressing", "Degraded", "replicas", "capacity", "planned",
                "observed", "attainment 1m"):
        t.add_column(col, justify="left" if col == "deployment" else "right")
    for d in st["deployments"]:
        c = {x["type"]: x for x in d["conditions"]}
        att = "-" if d["attainment_1m"] is None else f"{d['attainment_1m']:.2%}"
        serving = sum(r["serving"] for r in d["replicas"])
        t.add_row(d["name"], c["Ready"]["status"], c["Progressing"]["status"], c["Degraded"]["status"],
                  f"{serving}/{len(d['replicas'])}", f"{d['capacity_rps']:g}", f"{d['planned_rate']:g}",
                  f"{d['observed_rps']:g}", att)
    out.print(t)
    r = Table(title="replicas")
    for col in ("id", "variant", "GPU", "slice", "share", "req/s", "process", "serving"):
        r.add_column(col)
    for d in st["deployments"]:
        for x in d["replicas"]:
            r.add_row(x["id"], x["variant"], x["gpu_model"], x["slice"], f"{x['share']:.0%}",
                      f"{x['capacity_rps']:g}", x["process"], str(x["serving"]))
    out.print(r)
    llm = [d for d in st["deployments"] if d.get("llm")]
    if llm:
        g = Table(title="LLM deployments (since the gateway started)")
        for col in ("deployment", "variant", "SLO TTFT/TPOT ms", "requests", "TTFT met", "TPOT met", "both met",
                    "predicted"):
            g.add_column(col)

        def pct(v: float | None) -> str:
            return "-" if v is None else f"{v:.1%}"
        for d in llm:
            x = d["llm"]
            g.add_row(d["name"], str(x["variant"]), f"{x['slo_ttft_ms']:g}/{x['slo_tpot_ms']:g}", str(x["requests"]),
                      pct(x["ttft_attainment"]), pct(x["tpot_attainment"]), pct(x["both_attainment"]),
                      pct(x["predicted_attainment"]))
        out.print(g)
    for d in st["deployments"]:
        for x in d["conditions"]:
            if x["type"] == "Degraded" and x["status"] == "True":
                out.print(f"{d['name']}: Degraded ({x['reason']}): {x['message']}", highlight=False)
        floor = d.get("floor")
        if floor and floor["met"]:  # an unmet one is the Degraded line above
            out.print(f"{d['name']}: warning: {floor['message']}", highlight=False)
