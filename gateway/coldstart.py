"""Scale from zero: a request for a model that has no replica (its deployment scaled to zero)
waits here while the operator starts one, instead of being refused at once.

Only the models in ``waits`` (model -> seconds) are held. The first such request calls
``starter(model)`` (the controller plans a replica for it); every request for the model then
waits until a replica is added (:meth:`ColdStart.ready`), at most its model's seconds, as
Knative's activator holds requests for a revision at zero. A request still waiting then gets
503 ``no_replica`` with ``Retry-After``. A request's SLO counts from when a replica can take it:
the cold start itself is what the wait bounds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.errors import NoReplica
from gateway.policy.types import RejectReason


class ColdStart:
    def __init__(self, starter: Callable[[str], None], waits: dict[str, float] | None = None,
                 retry_after_s: float = 5.0) -> None:
        self.starter = starter
        self.waits = dict(waits or {})
        self.retry_after_s = retry_after_s
        self._warming: dict[str, asyncio.Event] = {}

    def holds(self, model: str) -> bool:
        """Whether a request for ``model`` with no replica waits for one (else it is refused)."""
        return model in self.waits

    async def wait(self, model: str) -> float:
        """Wait for ``model``'s first replica (asking for one if nobody has yet); returns the
        seconds waited, or raises :class:`NoReplica` after the model's wait."""
        ev = self._warming.get(model)
        if ev is None:
            ev = self._warming[model] = asyncio.Event()
            self.starter(model)
        loop = asyncio.get_running_loop()
        t0, limit = loop.time(), self.waits.get(model, 0.0)
        try:
            await asyncio.wait_for(ev.wait(), limit)
        except TimeoutError:
            if self._warming.get(model) is ev:  # the next request asks again
                del self._warming[model]
            raise NoReplica(f"model '{model}' has no replica: one is starting (waited {limit:g} s)",
                            RejectReason.NO_REPLICA, self.retry_after_s) from None
        return loop.time() - t0

    def ready(self, model: str) -> None:
        """A replica of ``model`` serves: what waits for it goes on."""
        ev = self._warming.pop(model, None)
        if ev is not None:
            ev.set()
