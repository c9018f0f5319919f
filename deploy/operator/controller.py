"""The controller: documents -> plan -> make-before-break apply -> a gateway serving the plan.

It drives the gateway through a :class:`gateway.handle.GatewayHandle`: by default a gateway
on its own event loop, and under ``headrace up`` a gateway process of its own, reached over
its authenticated control channel, which keeps serving while the controller is down.
Blocking work (solving, starting Triton) runs in a worker thread. One apply runs at a time.
Every tick it samples the gateway's counters, restarts a managed Triton, engine or gateway
that died (:mod:`deploy.operator.healing`), and steps each deployment's autoscaler
(:mod:`deploy.operator.autoscaler`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from deploy.operator.adopt import STATE_VERSION, fleet_to_state, gpus_from_state, llm_from_state
from deploy.operator.autoscaler import Autoscaler
from deploy.operator.desired import Desired, prepare
from deploy.operator.healing import Healer
from deploy.operator.llm_runtime import LlmEngines
from deploy.operator.observe import Observer
from deploy.operator.runtime import LocalRuntime, ProcessRuntime
from deploy.operator.state import StateError, StateStore
from deploy.operator.status import Event, status
from gateway.handle import GatewayHandle, LocalHandle, Seen
from placement import autoscale
from placement.apply.render import Endpoint, gateway_config
from placement.diff import PlanDiff, Step, diff, replan, stamp, waves
from placement.llm import (
    LlmPlan,
    LlmReplica,
    llm_models,
    model_config,
    place,
    replica_config,
)
from placement.plan import Plan
from placement.solve.solver import solve
from placement.spec import inventory, single_pool
from profiles.gateway_config import GatewayConfig
from profiles.profile import ProfileSet
from profiles.schema import SpecError

log = logging.getLogger("headrace.operator")


class ApplyError(RuntimeError):
    """A plan could not be made or applied; the message says which step and why."""


class Disruption(ApplyError):
    """A change would take a model's serving capacity below its need, and was not allowed to."""


FLEETS_KEPT = 20  # the generations whose fleets the state keeps for rollback (older: a re-plan of their documents)

# a step's undoing: the same step with the opposite action
INVERSE = {"start_replica": "stop_replica", "stop_replica": "start_replica", "create_slice": "destroy_slice",
           "destroy_slice": "create_slice", "start_mps": "stop_mps", "stop_mps": "start_mps",
           "enable_mig": "disable_mig", "disable_mig": "enable_mig"}


@dataclass
class Controller(Autoscaler, Healer):
    store: StateStore
    base_profiles: ProfileSet
    method: str = "greedy"
    tick: float = 1.0
    drain_timeout: float = 30.0
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    runtime: ProcessRuntime | None = None
    gateway: GatewayHandle | None = None
    # how the gateway is started for a plan's config (None: on this event loop)
    start_gateway: Callable[[GatewayConfig], Awaitable[GatewayHandle]] | None = None
    seen: Seen = field(default_factory=Seen)  # the gateway as last read
    desired: Desired | None = None
    plan: Plan | None = None
    llm_plan: LlmPlan = field(default_factory=LlmPlan)  # the generative deployments' engines
    engines: LlmEngines | None = None
    generation: int = 0
    observed_generation: int = 0
    history: list[int] = field(default_factory=list)  # applied generations, oldest first
    rates: dict[str, float] = field(default_factory=dict)  # autoscaled rates, by model
    scaling: dict[str, autoscale.AutoscaleState] = field(default_factory=dict)
    events: deque[Event] = field(default_factory=lambda: deque(maxlen=200))
    executed: list[list[str]] = field(default_factory=list)  # each apply's steps, as described
    applying: str | None = None  # what the running apply is doing
    failure: str | None = None  # why the last apply failed (and was not rolled back)
    rolled_back: str | None = None  # why the last apply was rolled back
    fleets: dict[int, tuple[Plan, LlmPlan]] = field(default_factory=dict)  # applied generations' fleets
    generations: dict[str, tuple[int, str]] = field(default_factory=dict)  # deployment -> (generation, spec digest)
    observed: dict[str, int] = field(default_factory=dict)  # deployment -> its generation the fleet serves
    restarting: dict[str, str] = field(default_factory=dict)  # replica id -> why
    observer: Observer = field(default_factory=Observer)
    transitions: dict[tuple[str, str], tuple[bool, float]] = field(default_factory=dict)  # condition -> (status, since)
    admin_url: str = ""
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _task: asyncio.Task | None = None
    _heals: set[asyncio.Task] = field(default_factory=set)
    _written: dict[str, Any] = field(default_factory=dict)  # the state as last read or written
    stored_fleets: dict[str, Any] = field(default_factory=dict)  # generation -> fleet, as an adopted state had them
    # how a running gateway process recorded in the state is taken over (None: it is not)
    # (the state's processes -> the gateway taken over, or None when none of it runs)
    adopt_gateway: Callable[[dict[str, Any]], Awaitable[GatewayHandle | None]] | None = None
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    # ------------------------------------------------------------------ lifecycle

    async def up(self, want: Desired) -> None:
        """Plan and serve the first generation (``want``: the command's documents, validated
        once): replicas, then the gateway configured from the plan."""
        async with self._lock:
            plan, steps, llm_plan = await asyncio.to_thread(self._solve_diff, want)
            self.runtime = self.runtime or LocalRuntime(want.profiles, self.store.run_dir, want.sources)
            self.engines = self.engines or LlmEngines(self.store.run_dir / "engines")
            if isinstance(self.runtime, LocalRuntime):
                self.runtime.set_profiles(want.profiles, want.sources)
            self.generation = 1
            self.store.save_generation(1, want.text)
            self._bump(want)
            self.applying = f"starting {sum(s.action == 'start_replica' for s in steps.steps)} replicas"
            try:
                for st in steps.steps:
                    await asyncio.to_thread(self.runtime.run, st)
                    self.save()
                for r in llm_plan.replicas:
                    await asyncio.to_thread(self.engines.start, r)
                    self.save()
                self.llm_plan = llm_plan
                cfg = self._render(plan, want, self.runtime.endpoints().values())
                self.gateway = await self._start_gateway(cfg)
                await self.look()
                self.observer.sample(self.seen.counters, self.clock())  # the counts' zero
            finally:
                self.applying = None
            self.desired, self.plan, self.observed_generation = want, plan, 1
            await self._cold_waits()
            self.observed = {n: g for n, (g, _) in self.generations.items()}
            self.history.append(1)
            self.fleets[1] = (plan, llm_plan)
            self.executed.append([s.describe() for s in steps.steps])
            self._reset_scaling()
            self._event("", "Applied", f"generation 1: {len(plan.replicas())} replicas on {plan.gpu_count} GPUs"
                        + (f", {len(llm_plan.replicas)} LLM engines" if llm_plan.replicas else ""))
            self.save()
        self._task = asyncio.create_task(self._loop())

    async def _start_gateway(self, cfg: GatewayConfig) -> GatewayHandle:
        if self.start_gateway is not None:
            return await self.start_gateway(cfg)
        from gateway.app import Gateway  # noqa: PLC0415

        gw = Gateway(cfg)
        await gw.start()
        return LocalHandle(gw)

    async def look(self) -> Seen:
        """Read what the gateway serves and its counters (kept in :attr:`seen` for status)."""
        if self.gateway is not None:
            self.seen = await self.gateway.look()
        return self.seen

    def preview(self, want: Desired) -> dict[str, Any]:
        """What :meth:`up` would start for ``want``: its steps, the replicas and engines it
        starts, and the GPUs the plan takes. Plans only: nothing starts, nothing is written."""
        plan, steps, llm_plan = self._solve_diff(want)
        return {"steps": [s.describe() for s in steps.steps]
                + [f"start LLM engine {r.id} ({r.profile.name})" for r in llm_plan.replicas],
                "started": [s.replica_id for s in steps.steps if s.action == "start_replica"]
                + [r.id for r in llm_plan.replicas],
                "gpus": plan.gpu_count + len(llm_plan.gpus), "plan": plan.to_dict()}

    async def down(self) -> None:
        """Stop the gateway (draining it) and every process; the state records nothing running."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for t in list(self._heals):
            t.cancel()
        try:
            if self.gateway is not None:
                await self.gateway.stop(min(self.drain_timeout, 5.0))
        finally:
            self.gateway = None
            if self.engines is not None:
                await asyncio.to_thread(self.engines.stop)
            if self.runtime is not None:
                await asyncio.to_thread(self.runtime.stop)
            st = self._state()
            st.update(processes={}, running=False)
            self.store.write(st)
            self.stopped.set()

    # ------------------------------------------------------------------ change

    async def apply(self, text: str, dry_run: bool = False, reason: str = "apply", *,
                    allow_disruption: bool = False, wait: bool = True, target: int | None = None) -> dict[str, Any]:
        """Validate, re-plan from the current plan (fewest moves) and roll the change out
        make-before-break. Returns the generation and the steps (``dry_run``: the steps it
        would execute, and ``refused`` when it would refuse). A change that would take a
        model's capacity below its need (:meth:`_disruptions`) is refused (:class:`Disruption`)
        unless ``allow_disruption``. ``wait``: return once the rollout is done (else once it
        has begun; status follows it). ``target``: restore generation ``target``'s fleet (its
        placement, variants and artifacts), not a re-plan of ``text``."""
        await self._lock.acquire()
        handed = False
        try:
            want = await asyncio.to_thread(prepare, text, self.base_profiles, reason)  # sizes LLM deployments
            if self.desired is not None and want.settings.workers != self.desired.settings.workers:
                raise SpecError(f"{reason}: Gateway spec.workers {self.desired.settings.workers} -> "
                                f"{want.settings.workers}: the gateway's worker count is set when it starts "
                                "(headrace down, then up with the new count)")
            if reason != "autoscale":
                self.rates = {}
            if target is not None and (target in self.fleets or str(target) in self.stored_fleets):
                new, d, llm_new = await asyncio.to_thread(self._restore, want, target)
            else:
                new, d, llm_new = await asyncio.to_thread(self._solve_diff, want)
            start, stop = self._llm_diff(llm_new)
            if reason == "autoscale" and (why := self._out_of_bounds(want, new)):
                raise ApplyError(why)
            dips = self._disruptions(want, d)
            out = {"generation": self.generation + (0 if dry_run or reason == "autoscale" else 1),
                   "steps": [s.describe() for s in d.steps] + [f"start LLM engine {r.id} ({r.profile.name})"
                                                               for r in start]
                   + [f"stop LLM engine {rid}" for rid in stop], "dry_run": dry_run,
                   "started": [s.replica_id for s in d.steps if s.action == "start_replica"] + [r.id for r in start],
                   "stopped": [s.replica_id for s in d.steps if s.action == "stop_replica"] + stop,
                   "capacity_dips": d.capacity_dips(), "plan": new.to_dict()}
            if dips and not allow_disruption:
                why = (f"the change would drop capacity: {dips[0]}"
                       + (f" (and {len(dips) - 1} more)" if len(dips) > 1 else "")
                       + "; the pool has no room to start its replicas beside the ones they replace"
                       + ("" if reason == "autoscale" else "; apply --allow-disruption to accept it"))
                if dry_run:
                    return {**out, "refused": why}
                raise Disruption(why)
            if dry_run:
                return out
            if reason != "autoscale":
                self.generation += 1
                self.store.save_generation(self.generation, text)
                self._bump(want)
            if wait:
                await self._commit(d, want, new, llm_new, reason, out)
                return out
            task = asyncio.create_task(self._commit(d, want, new, llm_new, reason, out, release=True))
            self._heals.add(task)
            task.add_done_callback(self._heals.discard)
            handed = True
            return {**out, "rolling": True}
        finally:
            if not handed:
                self._lock.release()

    async def _commit(self, d: PlanDiff, want: Desired, new: Plan, llm_new: LlmPlan, reason: str,
                      out: dict[str, Any], release: bool = False) -> None:
        """Run the change and record it (``release``: the apply lock is this task's to release)."""
        try:
            await self._execute(d, want, new, llm_new)
            if reason != "autoscale":
                self.observed_generation = self.generation
                self.observed = {n: g for n, (g, _) in self.generations.items()}
                self.history.append(self.generation)
                self._reset_scaling()
                await self._cold_waits()
            self.fleets[self.generation] = (self.plan, self.llm_plan)  # type: ignore[assignment]
            self._event("", "Applied", f"generation {self.generation} ({reason}): {len(out['steps'])} steps")
            self.save()
        except ApplyError:
            if not release:
                raise
        finally:
            if release:
                self._lock.release()

    def _bump(self, want: Desired) -> None:
        """Each deployment's generation: 1 when it appears, one more whenever its spec (or what
        its artifacts hold) changes; a deployment no longer declared is forgotten."""
        now = {}
        for md in want.docs.deployments:
            revs = sorted((v, r) for (m, v), r in want.revisions.items() if m == md.spec.model)
            digest = hashlib.sha256((md.spec.model_dump_json() + repr(revs)).encode()).hexdigest()[:16]
            gen, was = self.generations.get(md.metadata.name, (0, ""))
            now[md.metadata.name] = (gen if digest == was else gen + 1, digest)
        self.generations = now

    def _disruptions(self, want: Desired, d: PlanDiff) -> list[str]:
        """Where ``d`` takes a model's capacity below what it needs, beyond what the model's
        ``rollout.max_unavailable`` replicas down at once allow, one line each."""
        allowed = {md.spec.model: md.spec.rollout.max_unavailable for md in want.docs.deployments}
        return [f"{m} {c:.0f} < {n:.0f} req/s at step {i + 1} ({d.steps[i].describe()})"
                for i, m, c, n in d.dips() if d.down(i, m) > allowed.get(m, 0) or allowed.get(m, 0) == 0]

    async def rollback(self, to: int | None = None, dry_run: bool = False,
                       allow_disruption: bool = False) -> dict[str, Any]:
        """Restore generation ``to`` (default: the one before the current), as a new generation:
        its documents and, while this controller remembers it, its fleet (placement, variants,
        artifacts) rather than a re-plan of its documents."""
        if to is None:
            if len(self.history) < 2:
                raise ApplyError("no previous generation to roll back to")
            to = self.history[-2]
        if to not in self.history:
            raise ApplyError(f"generation {to} was never applied; applied: {self.history}")
        return await self.apply(self.store.generation(to), dry_run=dry_run, reason=f"rollback to generation {to}",
                                allow_disruption=allow_disruption, target=to)

    def _llm_diff(self, new: LlmPlan) -> tuple[list[LlmReplica], list[str]]:
        """The LLM engines ``new`` adds, and the ids of those it drops."""
        old = {r.id for r in self.llm_plan.replicas}
        keep = {r.id for r in new.replicas}
        return [r for r in new.replicas if r.id not in old], [rid for rid in old if rid not in keep]

    async def _execute(self, d: PlanDiff, want: Desired, new: Plan, llm_new: LlmPlan | None = None) -> None:
        """Run ``d``'s steps, then move the LLM engines to ``llm_new`` (None: as they are). A
        step that fails (a replica not Ready within its deployment's progress deadline) rolls
        the steps done back, in reverse, make-before-break again, and raises :class:`ApplyError`."""
        llm_new = self.llm_plan if llm_new is None else llm_new
        assert self.runtime is not None and self.gateway is not None
        if isinstance(self.runtime, LocalRuntime):
            self.runtime.set_profiles(want.profiles, want.sources)
        deadlines = {md.spec.model: md.spec.rollout.progress_deadline_s for md in want.docs.deployments}
        done: list[str] = []
        ran: list[Step] = []
        self.failure = self.rolled_back = None
        try:
            i = 0
            for wave in waves(d.steps, want.surge):
                first = wave[0]
                self.applying = (f"step {i + 1}/{len(d.steps)}: {first.describe()}" if len(wave) == 1 else
                                 f"steps {i + 1}-{i + len(wave)}/{len(d.steps)}: {len(wave)} replicas of "
                                 f"{first.replica.model} starting at once")  # type: ignore[union-attr]
                i += len(wave)
                if first.replica is not None and isinstance(self.runtime, LocalRuntime):
                    self.runtime.ex.ready_timeout = deadlines.get(first.replica.model, self.runtime.ex.ready_timeout)
                results = await asyncio.gather(*(self._step(st, new, want) for st in wave), return_exceptions=True)
                for st, res in zip(wave, results, strict=True):
                    if not isinstance(res, BaseException):
                        ran.append(st)
                        done.append(st.describe())
                self.save()
                failed = next((res for res in results if isinstance(res, BaseException)), None)
                if failed is not None:
                    raise failed
        except Exception as e:  # noqa: BLE001  (undone below, then reported)
            why = f"{self.applying}: {e}"
            self.executed.append(done)
            await self._undo(ran, why)
            self.applying = None
            raise ApplyError(self.failure or self.rolled_back or why) from e
        # make before break: the new engines serve before the old ones drain and stop
        start, stop = self._llm_diff(llm_new)
        engines = self.engines = self.engines or LlmEngines(self.store.run_dir / "engines")
        begun: list[str] = []
        try:
            for ch in llm_new.choices:  # the deployments' SLOs and priority, changed or not
                await self.gateway.set_llm_model(model_config(ch, []))
            for r in start:
                self.applying = f"starting LLM engine {r.id}"
                begun.append(r.id)
                url = await asyncio.to_thread(engines.start, r)
                ch = next(c for c in llm_new.choices if c.model == r.model)
                await self.gateway.add_llm_replica(model_config(ch, []), replica_config(r, url))
                done.append(f"start LLM engine {r.id}")
                self.save()
        except Exception as e:  # noqa: BLE001  (no old engine stopped yet: all of it is undone)
            why = f"{self.applying}: {e}"
            serving = await self.gateway.llm_replicas()
            for rid in reversed(begun):
                if rid in serving:
                    await self.gateway.remove_replica(rid, self.drain_timeout)
                await asyncio.to_thread(engines.stop_replica, rid)
            for ch in self.llm_plan.choices:
                await self.gateway.set_llm_model(model_config(ch, []))
            self.executed.append(done)
            await self._undo(ran, why)
            self.applying = None
            raise ApplyError(self.failure or self.rolled_back or why) from e
        stopped: set[str] = set()
        try:
            for rid in stop:
                self.applying = f"stopping LLM engine {rid}"
                if rid in await self.gateway.llm_replicas():
                    await self.gateway.remove_replica(rid, self.drain_timeout)
                await asyncio.to_thread(engines.stop_replica, rid)
                stopped.add(rid)
                done.append(f"stop LLM engine {rid}")
                self.save()
            for gone in {c.model for c in self.llm_plan.choices} - {c.model for c in llm_new.choices}:
                await self.gateway.drop_llm_model(gone)  # a deployment removed: its name answers 404
        except Exception as e:
            self.failure = f"{self.applying}: {e}"
            self._event("", "ApplyFailed", self.failure)
            # the classic steps and the new engines are done; the old engines not stopped serve
            # on, and the plan says so: the next apply (or rollback) stops them or keeps them
            left = tuple(r for r in self.llm_plan.replicas if r.id in stop and r.id not in stopped)
            self.desired, self.plan, self.llm_plan = want, new, replace(llm_new, replicas=llm_new.replicas + left)
            raise ApplyError(self.failure) from e
        finally:
            self.applying = None
            if not self.executed or self.executed[-1] is not done:
                self.executed.append(done)
        self.desired, self.plan, self.llm_plan = want, new, llm_new

    async def _step(self, st: Step, plan: Plan, want: Desired) -> None:
        """One step: a started replica joins the gateway once Ready; a stopped one leaves it
        first (the gateway stops sending to it and waits for its batches)."""
        assert self.runtime is not None and self.gateway is not None
        if st.action == "stop_replica":
            if st.replica_id in await self.gateway.replicas():
                # a model the plan still serves stays addressable even if a re-plan from
                # scratch must free this slice before the next replica can start
                stays = any(dm.model == st.replica.model for dm in plan.demands)  # type: ignore[union-attr]
                await self.gateway.remove_replica(st.replica_id, self.drain_timeout, keep_model=stays)
            await asyncio.to_thread(self.runtime.run, st)
        elif st.action == "start_replica":
            ep = await asyncio.to_thread(self.runtime.run, st)
            if ep is not None:
                try:
                    await self._add_to_gateway(plan, want, ep)
                except BaseException:  # the gateway refused it: it must not run unseen
                    await asyncio.to_thread(self.runtime.run, replace(st, action="stop_replica"))
                    raise
        else:
            await asyncio.to_thread(self.runtime.run, st)

    async def _undo(self, ran: list[Step], why: str) -> None:
        """Undo ``ran`` (the steps a failed change did), newest first: the fleet of the running
        plan and documents again. Sets ``rolled_back`` (or ``failure`` if undoing fails too)."""
        assert self.runtime is not None and self.plan is not None and self.desired is not None
        if isinstance(self.runtime, LocalRuntime):
            self.runtime.set_profiles(self.desired.profiles, self.desired.sources)
        try:
            for k, st in enumerate(reversed(ran)):
                back = replace(st, action=INVERSE[st.action])
                self.applying = f"rolling back {k + 1}/{len(ran)}: {back.describe()}"
                await self._step(back, self.plan, self.desired)
                self.save()
        except Exception as e:  # noqa: BLE001
            self.failure = f"{why}; rolling back failed at {self.applying}: {e}"
            self._event("", "ApplyFailed", self.failure)
            return
        self.rolled_back = f"{why}; rolled back to generation {self.observed_generation} ({len(ran)} steps undone)"
        self._event("", "RolledBack", self.rolled_back)

    async def _add_to_gateway(self, plan: Plan, want: Desired, ep: Endpoint) -> None:
        await self.gateway.add_replica(self._render(plan, want, [ep]), ep.model)  # type: ignore[union-attr]

    def _render(self, plan: Plan, want: Desired, endpoints) -> GatewayConfig:  # noqa: ANN001
        llm = llm_models(self.llm_plan, self.engines.urls() if self.engines else {},
                         self.engines.profiles() if self.engines else None)
        return gateway_config(plan, endpoints, want.profiles, self.store.run_dir / "profiles", want.settings, llm)

    def _solve_diff(self, want: Desired) -> tuple[Plan, PlanDiff, LlmPlan]:
        """A verified plan for ``want``, the steps from the running plan (none: from nothing), and
        the LLM engines, placed first on whole GPUs the classic plan then does without. The
        plan's replicas carry their revisions and ids."""
        busy = frozenset(g.id for g in self.plan.used()) if self.plan else frozenset()
        llm, inv = place(want.llm, inventory(single_pool(want.docs, ["apply"])), self.llm_plan, busy)
        demands = want.demands(self.rates)
        if self.plan is None or llm.gpus & busy:  # an LLM took a GPU of the running plan: plan afresh
            fresh = solve(demands, want.profiles, inv, self.method, bound=self.method != "greedy")  # no gap needed
            d = diff(self.plan, stamp(fresh, want.revisions), want.surge)
        else:
            _, d = replan(self.plan, demands, want.profiles, inv, self.method, revisions=want.revisions,
                          surge=want.surge)
        d.new.verify()
        return d.new, d, llm

    def _restore(self, want: Desired, generation: int) -> tuple[Plan, PlanDiff, LlmPlan]:
        """Generation ``generation``'s fleet, re-verified, and the steps to it from the running plan."""
        if generation in self.fleets:
            plan, llm = self.fleets[generation]
        else:  # recorded by a controller before this one
            rec = self.stored_fleets[str(generation)]
            assert self.plan is not None
            plan, llm = replace(self.plan, gpus=gpus_from_state(rec["gpus"])), llm_from_state(rec["llm"], tuple(want.llm))
        old = stamp(replace(plan, demands=tuple(want.demands({})), profiles=want.profiles), want.revisions)
        old.verify()
        d = diff(self.plan, old, want.surge)
        return d.new, d, llm

    # ------------------------------------------------------------------ the loop

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            try:
                await self._tick(self.clock())
            except Exception:  # noqa: BLE001  (the loop must go on; the error is logged)
                log.exception("controller tick failed")

    async def _tick(self, now: float) -> None:
        if self.gateway is None or self.runtime is None:
            return
        if "gateway" in self.restarting:
            return
        if not getattr(self.gateway, "alive", lambda: True)():  # a gateway process that died
            self._heal_gateway()
            return
        await self.look()
        self.observer.sample(self.seen.counters, now)
        for rid, ep in list(self.runtime.endpoints().items()):
            if rid not in self.restarting and not self.runtime.alive(rid):
                self._heal(rid, ep.model, "Triton", self.runtime.restart)
        for rid, e in list(self.engines.engines.items()) if self.engines else ():
            if rid not in self.restarting and not self.engines.alive(rid):
                self._heal(rid, e.replica.model, "the LLM engine", self.engines.restart)
        if self.applying is None and not self._lock.locked():
            await self._autoscale(now)

    # ------------------------------------------------------------------ status

    def _event(self, model: str, kind: str, message: str) -> None:
        log.info("%s %s %s", model or "-", kind, message)
        ev = Event(self.wall(), model, kind, message)
        self.events.append(ev)
        record = getattr(self.store, "record_event", None)  # a state directory keeps every event
        if record is not None:
            try:
                record(ev.to_dict())
            except OSError as e:
                log.warning("event not recorded in the state directory: %s", e)

    def _state(self) -> dict[str, Any]:
        """The stored state; if its file went corrupt while this controller runs, the last one
        it wrote (it knows the rest), with an event that says so."""
        try:
            self._written = self.store.read()
        except StateError as e:
            self._event("", "StateRewritten", f"state file {e.path} was corrupt ({e.why}); rewritten from "
                        "this controller's own record")
        return dict(self._written)

    def save(self) -> None:
        st = self._state()
        gw = getattr(self.gateway, "records", None) or {}  # gateway processes: pid and control address
        fleets = {**self.stored_fleets, **{str(g): fleet_to_state(p.gpus, llm) for g, (p, llm) in self.fleets.items()}}
        st.update(
            state_version=STATE_VERSION,
            running=True, generation=self.generation, observed_generation=self.observed_generation,
            history=self.history, admin_url=self.admin_url,
            gateway={"http": self.gateway.http_url, "grpc": self.gateway.grpc_url} if self.gateway else None,
            processes={**(self.runtime.processes() if self.runtime else {}),
                       **(self.engines.processes() if self.engines else {}),
                       **gw},
            plan=self.plan.to_dict() if self.plan else None,
            # what a controller that takes this fleet over needs (deploy.operator.adopt)
            fleet=fleet_to_state(self.plan.gpus, self.llm_plan) if self.plan else None,
            fleets={g: fleets[g] for g in sorted(fleets, key=int)[-FLEETS_KEPT:]},
            generations={n: list(v) for n, v in self.generations.items()}, observed=dict(self.observed),
            rates=dict(self.rates),
        )
        self.store.write(st)
        self._written = st

    def status(self) -> dict[str, Any]:
        return status(self)

    def serving(self) -> dict[str, tuple[int, bool]]:
        worker = getattr(self.gateway, "worker_of", lambda rid: 0)  # gateway workers: which one serves it
        return {rid: (worker(rid) or 0, healthy) for rid, healthy in self.seen.replicas.items()}

    def documents_yaml(self) -> str:
        return self.desired.text if self.desired else ""
