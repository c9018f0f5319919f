"""An engine's steps against a clock its driver owns: the one loop the emulated engines (the
OpenAI server, the Triton model) and the token-level simulator run.

The driver calls :meth:`EngineLoop.poll` with the time whenever it wakes (a request came, an
abort, or :attr:`EngineLoop.wake` passed); the loop completes the step that has ended and starts
the next, as an engine that never idles while it has work. A step that follows another starts
when that one ended, so a driver that wakes late does not slow the engine down; a step after an
idle spell starts at the poll that finds work.

Sans-IO: ``now`` comes in; sleeping and sending are the driver's.
"""

from __future__ import annotations

from profiles.llm.engine import Engine, LlmRequest, Step, StepOutput


class EngineLoop:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.step: Step | None = None
        self.started_at = 0.0
        self.ends_at = 0.0

    @property
    def wake(self) -> float | None:
        """When the running step ends (None: no step runs, so only a new request wakes it)."""
        return self.ends_at if self.step is not None else None

    def add(self, req: LlmRequest) -> None:
        """Queue a request (RequestTooLong or ValueError when the engine refuses it); the next
        poll starts a step if none runs."""
        self.engine.add(req)

    def abort(self, request_id: str) -> bool:
        return self.engine.abort(request_id)

    def poll(self, now: float) -> StepOutput | None:
        """Complete the step that ended by ``now`` (its output, else None) and start the next."""
        out = None
        start = now
        if self.step is not None:
            if now < self.ends_at:
                return None
            out = self.engine.complete(self.step)
            start = self.ends_at
            self.step = None
        step = self.engine.schedule()
        if step is not None:
            self.step, self.started_at, self.ends_at = step, start, start + step.seconds
        return out
