"""The controller's self-healing: a managed Triton, LLM engine or gateway process that died is
started again, in the background, with an event before and after (the deployment reads
``Degraded`` meanwhile; the gateway fails over on its own). A mixin of
:class:`deploy.operator.controller.Controller`, whose state it reads and changes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from gateway.config import with_ports


def port_of(address: str) -> int:
    """The port of ``host:port``."""
    return int(address.rsplit(":", 1)[1])


class Healer:
    """Restarts what died (its attributes are the controller's)."""

    def _heal(self, rid: str, model: str, what: str, restart_fn: Callable[[str], None]) -> None:
        self.restarting[rid] = "process exited"
        self._event(model, "ReplicaDown", f"{rid}: {what} exited; restarting it")

        async def restart() -> None:
            try:
                await asyncio.to_thread(restart_fn, rid)
                self._event(model, "Restarted", f"{rid}: {what} is back")
            except Exception as e:  # noqa: BLE001
                self._event(model, "RestartFailed", f"{rid}: {e}")
                await asyncio.sleep(self.tick)
            finally:
                self.restarting.pop(rid, None)
                self.save()

        t = asyncio.create_task(restart())
        self._heals.add(t)
        t.add_done_callback(self._heals.discard)

    def _heal_gateway(self) -> None:
        """Start the gateway process again, serving the running fleet, on the ports it served
        on (clients keep their address); if another process took them meanwhile, on the ports
        its config names (ports 0: new ones, which status shows). Of gateway workers, only the
        ones that died are started again, on the ports the others still serve."""
        self.restarting["gateway"] = "process exited"
        dead = getattr(self.gateway, "dead", lambda: [])()
        self._event("", "GatewayDown", f"gateway worker{'s' if len(dead) > 1 else ''} {', '.join(map(str, dead))} "
                    "exited; starting it again" if dead else "the gateway process exited; starting it again")

        async def restart() -> None:
            assert self.plan is not None and self.desired is not None and self.runtime is not None
            try:
                old = self.gateway
                assert old is not None
                cfg = self._render(self.plan, self.desired, self.runtime.endpoints().values())
                heal = getattr(old, "heal", None)
                if heal is not None:  # gateway workers: the others serve on
                    back = await heal(cfg)
                    await self._cold_waits()
                    self._event("", "Restarted", f"gateway worker{'s' if len(back) > 1 else ''} "
                                f"{', '.join(map(str, back))} back on http {old.http_url}, grpc {old.grpc_url}")
                    return
                same = with_ports(cfg.model_copy(deep=True), http_port=port_of(old.http_url),
                                  grpc_port=port_of(old.grpc_url))
                try:
                    self.gateway = await self._start_gateway(same)
                except (RuntimeError, OSError):
                    self.gateway = await self._start_gateway(cfg)
                with contextlib.suppress(Exception):
                    await old.stop(0.0)  # type: ignore[union-attr]  (what is left of it)
                await self._cold_waits()
                self._event("", "Restarted", f"the gateway is back: http {self.gateway.http_url}, "
                            f"grpc {self.gateway.grpc_url}")
            except Exception as e:  # noqa: BLE001  (the next tick tries again)
                self._event("", "RestartFailed", f"the gateway: {e}")
                await asyncio.sleep(self.tick)
            finally:
                self.restarting.pop("gateway", None)
                self.save()

        t = asyncio.create_task(restart())
        self._heals.add(t)
        t.add_done_callback(self._heals.discard)
