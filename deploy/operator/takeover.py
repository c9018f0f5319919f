"""Taking a running fleet over: what a controller restarted by its supervisor does, instead of
``up``, when the state directory records a fleet that still runs (:mod:`deploy.operator.adopt`
has the records it reads)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from deploy.operator.adopt import STATE_VERSION, alive, gpus_from_state, llm_from_state
from deploy.operator.desired import prepare
from deploy.operator.llm_runtime import LlmEngines
from deploy.operator.runtime import LocalRuntime
from deploy.operator.status import Event
from placement.diff import Step, replica_ids
from placement.llm import place
from placement.plan import Plan
from placement.spec import inventory, single_pool

if TYPE_CHECKING:
    from deploy.operator.controller import Controller
    from deploy.operator.desired import Desired


class AdoptError(RuntimeError):
    """A state this controller cannot take over; the message says why and how to proceed."""


def check_adoptable(st: dict[str, Any]) -> None:
    """Raise :class:`AdoptError` unless ``st`` records a fleet this controller can take over."""
    version = st.get("state_version")
    if not st:
        raise AdoptError("the state directory records no fleet; start one with headrace up")
    if version is None:
        raise AdoptError("the state directory was written by an older headrace, which kept no record of its "
                         "fleet to take over; run headrace down (it stops what the state records), then headrace up")
    if version != STATE_VERSION:
        raise AdoptError(f"the state directory is of version {version}, this headrace reads {STATE_VERSION}; "
                         "use the headrace that wrote it, or headrace down, then headrace up")
    if not st.get("running") or not st.get("fleet") or not st.get("observed_generation"):
        raise AdoptError("the state records no running fleet to take over; start one with headrace up")


async def take_over(ctl: Controller, st: dict[str, Any], want: Desired | None = None) -> None:
    """Make ``ctl`` the controller of the fleet ``st`` records, restarting nothing that runs:
    the documents and fleet of the generation it serves, its replicas, engines and emulated
    GPUs (by pid and start time), its gateway, history, rollback fleets and events. What the
    state records but is gone is started again by the controller's loop; a replica running
    beside the recorded fleet (a rollout the controller died in) is drained and stopped, and
    the rollout reads as interrupted. ``want``: the served generation's documents, prepared
    (None: read from the state directory here)."""
    check_adoptable(st)
    served = int(st["observed_generation"])
    if want is None:
        want = await asyncio.to_thread(prepare, ctl.store.generation(served), ctl.base_profiles, "adopt")
    ctl.generation, ctl.observed_generation, ctl.history = int(st["generation"]), served, list(st["history"])
    ctl.rates = {m: float(r) for m, r in (st.get("rates") or {}).items()}
    ctl.generations = {n: (int(v[0]), str(v[1])) for n, v in (st.get("generations") or {}).items()}
    ctl.observed = {n: int(g) for n, g in (st.get("observed") or {}).items()}
    ctl.stored_fleets = dict(st.get("fleets") or {})
    fleet = st["fleet"]
    llm = llm_from_state(fleet["llm"], tuple(want.llm))
    _, inv = place(want.llm, inventory(single_pool(want.docs, ["adopt"])), llm, frozenset())
    plan = Plan(gpus_from_state(fleet["gpus"]), tuple(want.demands(ctl.rates)), inv, method=ctl.method,
                profiles=want.profiles)
    ctl.desired, ctl.plan, ctl.llm_plan = want, plan, llm
    for e in ctl.store.events()[-ctl.events.maxlen:] if hasattr(ctl.store, "events") else ():  # type: ignore[operator]
        ctl.events.append(Event.from_dict(e))
    procs = st.get("processes") or {}
    runtime = ctl.runtime = ctl.runtime or LocalRuntime(want.profiles, ctl.store.run_dir, want.sources)
    engines = ctl.engines = ctl.engines or LlmEngines(ctl.store.run_dir / "engines")
    gone = runtime.adopt(procs) + engines.adopt(procs, {r.id: r for r in llm.replicas})  # type: ignore[attr-defined]
    planned = {rid for g in plan.gpus for s in g.slices for rid in replica_ids(g, s)}
    extra = [rid for rid in runtime.endpoints() if rid not in planned]
    eps = [ep for rid, ep in runtime.endpoints().items() if rid in planned]
    adopted = None
    if ctl.adopt_gateway is not None:
        try:
            adopted = await ctl.adopt_gateway(procs)
        except (RuntimeError, OSError) as e:
            pids = [str(r["pid"]) for k, r in sorted(procs.items()) if k.startswith("gateway") and alive(r)]
            raise AdoptError(f"the gateway process (pid {', '.join(pids)}) runs but cannot be taken over: {e}; "
                             "headrace down stops it and the rest of the fleet") from None
    if adopted is not None:
        ctl.gateway = adopted
        learn = getattr(adopted, "learn", None)  # gateway workers: how each replica is served, to move it
        if learn is not None:
            learn(ctl._render(plan, want, eps))  # noqa: SLF001
    else:
        ctl.gateway = await ctl._start_gateway(ctl._render(plan, want, eps))  # noqa: SLF001
        ctl._event("", "GatewayRestarted", "the gateway process was gone; started again from the fleet")  # noqa: SLF001
    serving = await ctl.gateway.replicas()
    # a replica of the fleet with no record (a rollout the last controller did not finish had
    # stopped it): started again, before the replicas that rollout started are stopped
    missing = [Step("start_replica", g.id, g.gpu, s, r, rid) for g in plan.gpus for s in g.slices
               for r, rid in zip(s.replicas, replica_ids(g, s), strict=True) if rid not in runtime.endpoints()]
    for st in missing:
        await ctl._step(st, plan, want)  # noqa: SLF001
    for rid in extra:  # started by a rollout the last controller did not finish
        if rid in serving:
            await ctl.gateway.remove_replica(rid, ctl.drain_timeout, keep_model=True)
        await asyncio.to_thread(runtime.discard, rid)
    for rid, ep in runtime.endpoints().items():  # ready, but the last controller died before adding it
        if rid not in serving:
            await ctl._add_to_gateway(plan, want, ep)  # noqa: SLF001
    for rid in set(serving) - set(runtime.endpoints()) - set(extra):  # its process stopped, its route not
        await ctl.gateway.remove_replica(rid, 1.0, keep_model=True)
    ctl.fleets[served] = (plan, llm)
    n = len(runtime.endpoints()) + len(engines.engines)
    ctl._event("", "Adopted", f"generation {served}: {n} replicas and engines and the gateway taken over as they "  # noqa: SLF001
               "run" + (f"; {len(gone)} were gone and are started again ({', '.join(gone)})" if gone else "")
               + (f"; {len(missing)} an unfinished rollout had stopped started again" if missing else "")
               + (f"; {len(extra)} started by an unfinished rollout stopped" if extra else ""))
    if ctl.generation != served:
        ctl.failure = (f"the controller restarted during the rollout of generation {ctl.generation}; the fleet "
                       f"serves generation {served}; apply generation {ctl.generation}'s documents again")
        ctl._event("", "RolloutInterrupted", ctl.failure)  # noqa: SLF001
    await ctl.look()
    ctl.observer.sample(ctl.seen.counters, ctl.clock())
    ctl._reset_scaling()  # noqa: SLF001
    await ctl._cold_waits()  # noqa: SLF001
    ctl.save()
