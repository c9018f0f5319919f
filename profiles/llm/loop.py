"""An engine's steps against a clock its driver owns: the one loop the emulated engines (the
OpenAI server, the Triton model) and the token-level simulator run.

The driver calls :meth:`EngineLoop.poll` with the time whenever it wakes (a request came, an
abort, or :attr:`EngineLoop.wake` passed); the loop completes the step that has ended and starts
the next, as an engine that never idles while it has work. A step that follows another starts
when that one ended, so a driver that wakes late does not slow the engine down; a step after an
idle spell starts at the poll that finds work.

A server's front end (HTTP, the tokenizer, the hand-off to the engine core) takes
``frontend_s`` of a request's way in, beside the steps: vLLM runs it in its API-server process
while the engine core steps. A request added at ``now`` joins the scheduler's queue at
``now + frontend_s`` (the profile's ``frontend_ms``; 0 joins at once).

Sans-IO: ``now`` comes in; sleeping and sending are the driver's.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from profiles.llm.engine import Engine, LlmRequest, Step, StepOutput


class EngineLoop:
    def __init__(self, engine: Engine, frontend_s: float = 0.0) -> None:
        if frontend_s < 0:
            raise ValueError(f"frontend_s must be at least 0, got {frontend_s}")
        self.engine = engine
        self.frontend_s = frontend_s
        self.arriving: deque[tuple[float, str]] = deque()  # (when it joins the queue, request id)
        self.step: Step | None = None
        self.started_at = 0.0
        self.ends_at = 0.0

    @property
    def wake(self) -> float | None:
        """When the running step ends or an arriving request joins the queue, whichever is
        first (None: neither, so only a new request wakes it)."""
        times = [self.ends_at] if self.step is not None else []
        if self.arriving:
            times.append(self.arriving[0][0])
        return min(times) if times else None

    def add(self, req: LlmRequest, now: float) -> None:
        """A request arriving at ``now`` (RequestTooLong or ValueError when the engine refuses it);
        it joins the queue ``frontend_s`` later, and the poll then starts a step if none runs."""
        if self.frontend_s == 0:
            self.engine.add(req)
            return
        self.engine.add(req, arriving=True)
        self.arriving.append((now + self.frontend_s, req.id))

    def abort(self, request_id: str) -> bool:
        return self.engine.abort(request_id)

    def _admit(self, until: float) -> None:
        while self.arriving and self.arriving[0][0] <= until:
            self.engine.admit(self.arriving.popleft()[1])

    def _start(self, at: float) -> None:
        step = self.engine.schedule()
        if step is not None:
            self.step, self.started_at, self.ends_at = step, at, at + step.seconds

    def poll(self, now: float) -> StepOutput | None:
        """Complete the step that ended by ``now`` (its output, else None) and start the next;
        each step starts at the earliest moment it could (the previous step's end, or the
        arrival that found the engine idle), however late the poll."""
        out = None
        if self.step is not None:
            if now < self.ends_at:
                self._admit(now)
                return None
            self._admit(self.ends_at)
            out = self.engine.complete(self.step)
            self.step = None
            self._start(self.ends_at)
        while self.step is None and self.arriving and self.arriving[0][0] <= now:
            at = self.arriving[0][0]
            self._admit(at)
            self._start(at)
        self._admit(now)
        if self.step is None:
            self._start(now)
        return out


def replay(loop: EngineLoop, arrivals: Sequence[tuple[float, LlmRequest]]) -> dict[str, list[float]]:
    """Each request's token times when ``arrivals`` (time, request; sorted by time) come to
    ``loop`` in virtual time, steps back to back: a token is stamped with the end of the step
    that made it; a request arriving as a step ends is in the queue the next step starts from."""
    times: dict[str, list[float]] = {r.id: [] for _, r in arrivals}
    k, n = 0, len(arrivals)
    while k < n or loop.wake is not None:
        now = min(arrivals[k][0] if k < n else math.inf, loop.wake if loop.wake is not None else math.inf)
        while k < n and arrivals[k][0] <= now:
            loop.add(arrivals[k][1], arrivals[k][0])
            k += 1
        out = loop.poll(now)
        for rid, _ in out.tokens if out else ():
            times[rid].append(now)
    return times
