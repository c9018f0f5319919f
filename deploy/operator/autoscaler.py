"""The controller's autoscaler: each deployment with ``autoscaling`` is stepped every tick
(:mod:`placement.autoscale`) on the rate the gateway observes, and a change of its planned rate
is applied as any change is (make-before-break, never below its need); a model at zero
replicas is started by its first request, which the gateway holds meanwhile
(:class:`gateway.coldstart.ColdStart`). A mixin of :class:`deploy.operator.controller.Controller`,
whose state it reads and changes."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from placement import autoscale
from placement.plan import KEEP_SERVED

if TYPE_CHECKING:
    from deploy.operator.desired import Desired
    from placement.plan import Plan
    from profiles.schema import AutoscalingSpec


def rate_window(upscale_delay_s: float) -> float:
    """Seconds the autoscaler's observed rate is averaged over: at most the upscale delay (a
    step shows within it), at least a second (Poisson noise), at most 5 s."""
    return max(1.0, min(upscale_delay_s, 5.0))


class Autoscaler:
    """The controller's autoscaling and scale-from-zero (its attributes are the controller's)."""

    async def _cold_waits(self) -> None:
        """The models that scale to zero (autoscaling.min_replicas 0): the gateway holds their
        requests while they have no replica, each up to its cold_start_timeout_s."""
        if self.gateway is not None and self.desired is not None:
            await self.gateway.hold_cold({md.spec.model: md.spec.autoscaling.cold_start_timeout_s
                                          for md in self.desired.docs.deployments
                                          if md.spec.autoscaling is not None
                                          and md.spec.autoscaling.min_replicas == 0}, self._cold)

    def _cold(self, model: str) -> None:
        """The gateway's call: a request for ``model``, which has no replica, waits for one."""
        t = asyncio.create_task(self._scale_from_zero(model))
        self._heals.add(t)
        t.add_done_callback(self._heals.discard)

    async def _scale_from_zero(self, model: str) -> None:
        """Plan ``model`` at its declared rate (at least its min_rate, else one replica's worth)
        and start what that needs; the gateway lets the waiting requests go when it serves."""
        md = next((m for m in self.desired.docs.deployments if m.spec.model == model), None) if self.desired else None
        if md is None or md.spec.autoscaling is None:
            return
        rate = max(md.spec.rate, md.spec.autoscaling.min_rate or 0.0) or KEEP_SERVED
        old = self.rates.get(model)
        self.rates[model] = rate
        self._event(model, "ScaleFromZero", f"a request arrived and no replica serves; planning {rate:g} req/s")
        try:
            await self.apply(self.desired.text, reason="autoscale")  # type: ignore[union-attr]
        except Exception as e:  # noqa: BLE001  (the waiting requests get 503 when their wait ends)
            if old is None:
                self.rates.pop(model, None)
            else:
                self.rates[model] = old
            self._event(model, "ScaleFailed", f"from zero: {e}")
            return
        self.scaling[model] = autoscale.initial(rate * md.spec.headroom, self.clock())
        self._event(model, "ScaledUp", f"from zero: {sum(r.model == model for _, _, r in self.plan.replicas())} "
                    "replicas")  # type: ignore[union-attr]

    def _reset_scaling(self) -> None:
        now = self.clock()
        self.scaling = {}
        for md in self.desired.docs.deployments if self.desired else []:
            if md.spec.autoscaling is not None and md.spec.autoscaling.enabled:
                # the band is the planned capacity (rate x headroom): load within it needs no change
                rate = self.rates.get(md.spec.model, md.spec.rate)
                self.scaling[md.spec.model] = autoscale.initial(rate * md.spec.headroom, now)

    def _scale_spec(self, model: str) -> AutoscalingSpec:
        md = next(m for m in self.desired.docs.deployments if m.spec.model == model)  # type: ignore[union-attr]
        assert md.spec.autoscaling is not None
        return md.spec.autoscaling

    def _out_of_bounds(self, want: Desired, plan: Plan) -> str | None:
        """Why ``plan`` breaks a deployment's min_replicas / max_replicas (None: it does not)."""
        for md in want.docs.deployments:
            a = md.spec.autoscaling
            if a is None:
                continue
            n = sum(1 for _, _, r in plan.replicas() if r.model == md.spec.model)
            if a.max_replicas is not None and n > a.max_replicas:
                return f"{md.spec.model}: the plan needs {n} replicas, above max_replicas ({a.max_replicas})"
            # a floor the pool cannot meet is the plan's FloorShortfall, which status shows
            if n < a.min_replicas and not any(f.model == md.spec.model for f in plan.floors):
                return f"{md.spec.model}: the plan keeps {n} replicas, below min_replicas ({a.min_replicas})"
        return None

    async def _autoscale(self, now: float) -> None:
        for model, state in list(self.scaling.items()):
            spec = self._scale_spec(model)
            window_s = rate_window(spec.upscale_delay_s)
            window = self.observer.window(model, window_s, now)
            replicas = sum(1 for _, _, r in self.plan.replicas() if r.model == model) if self.plan else None
            decision, self.scaling[model] = autoscale.step(spec, state, window.rate, now, window_s=window_s,
                                                           replicas=replicas)
            if decision.direction is None:
                continue
            old = self.rates.get(model)
            headroom = next(m.spec.headroom for m in self.desired.docs.deployments  # type: ignore[union-attr]
                            if m.spec.model == model)
            self.rates[model] = decision.rate / headroom
            try:
                out = await self.apply(self.desired.text, reason="autoscale")  # type: ignore[union-attr]
            except Exception as e:  # noqa: BLE001
                if old is None:
                    self.rates.pop(model, None)
                else:
                    self.rates[model] = old
                # back to the old band; a new try only after another full delay
                self.scaling[model] = autoscale.initial(state.planned_rate, now)
                self._event(model, "ScaleFailed", f"{decision.reason}: {e}")
                continue
            n = sum(1 for _, _, r in self.plan.replicas() if r.model == model)  # type: ignore[union-attr]
            kind = "ScaledUp" if decision.direction == "up" else "ScaledDown"
            self._event(model, kind, f"{decision.reason}; {len(out['steps'])} steps, {n} replicas")

