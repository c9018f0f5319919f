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

With ``fast_forward`` (the simulator's), steps that only decode the same requests, with nothing
able to join them, are taken as one run (:meth:`profiles.llm.engine.Engine.decode_run`). A decode
step's time is linear in the KV tokens it reads, which grow by one per request each step, so the
run's step times are an arithmetic series: the first step's time and the growth per step come
from the profile's step time, and any step's end is summed in closed form. The run is applied in
one go when it ends, or up to the moment the driver polls; a request added meanwhile ends it at
the step it joins. A poll returns such steps as one :class:`RunOutput` (who got a token at each
step's end) instead of one :class:`StepOutput` a step. Tokens, KV blocks, events and counters are
those of stepping one by one, and token times agree to rounding (``tests/test_llm_sim.py``).

Sans-IO: ``now`` comes in; sleeping and sending are the driver's.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from profiles.llm.engine import DecodeRun, Engine, LlmRequest, Step, StepOutput
from profiles.llm.kv import KvEvent

MAX_RUN = 4096  # steps a run takes at most (a request that joins ends it sooner)


@dataclass(slots=True)
class Series:
    """The step ends of a decode run: it starts at ``start``, its first step takes ``first``
    seconds and each next ``grow`` more."""

    start: float
    first: float
    grow: float

    def end(self, n: int) -> float:
        """When ``n`` of its steps have ended (``start`` for none)."""
        return self.start + n * self.first + self.grow * (n * (n - 1) / 2)

    def ended(self, t: float, before: bool = False) -> int:
        """How many steps have ended by ``t`` (``before``: strictly before it)."""
        x = t - self.start
        b = self.first - self.grow / 2
        if self.grow > 0:
            n = int(max(0.0, (math.sqrt(max(0.0, b * b + 2 * self.grow * x)) - b) / self.grow))
        else:
            n = int(max(0.0, x / self.first))
        over = (lambda k: self.end(k) >= t) if before else (lambda k: self.end(k) > t)
        while n > 0 and over(n):
            n -= 1
        while not over(n + 1):
            n += 1
        return n


@dataclass(slots=True)
class RunOutput:
    """Steps ``done`` to ``done + steps`` of a decode run, which have ended: each of ``ids``
    sampled one token at the end of each; ``finished`` took their last token at :attr:`last`."""

    ids: list[str]
    series: Series
    done: int
    steps: int
    finished: list[str]
    events: list[KvEvent]

    @property
    def last(self) -> float:
        return self.series.end(self.done + self.steps)

    @property
    def ends(self) -> list[float]:
        """The end of each of these steps."""
        return [self.series.end(n) for n in range(self.done + 1, self.done + self.steps + 1)]


class EngineLoop:
    def __init__(self, engine: Engine, frontend_s: float = 0.0, fast_forward: bool = False,
                 max_run: int = MAX_RUN) -> None:
        if frontend_s < 0:
            raise ValueError(f"frontend_s must be at least 0, got {frontend_s}")
        if max_run < 1:
            raise ValueError(f"max_run must be at least 1 step, got {max_run}")
        self.engine = engine
        self.frontend_s = frontend_s
        self.fast_forward = fast_forward
        self.max_run = max_run
        self.arriving: deque[tuple[float, str]] = deque()  # (when it joins the queue, request id)
        self.step: Step | None = None
        self.run: DecodeRun | None = None
        self.series = Series(0.0, 0.0, 0.0)  # the run's step ends
        self.started_at = 0.0
        self.ends_at = 0.0
        self.steps = 0  # steps started one by one
        self.runs = 0  # decode runs started, and their steps
        self.run_steps = 0

    @property
    def wake(self) -> float | None:
        """When the running step (or run) ends or an arriving request joins the queue, whichever
        is first (None: neither, so only a new request wakes it)."""
        times = [self.ends_at] if self.step is not None or self.run is not None else []
        if self.arriving:
            times.append(self.arriving[0][0])
        return min(times) if times else None

    def add(self, req: LlmRequest, now: float) -> None:
        """A request arriving at ``now`` (RequestTooLong or ValueError when the engine refuses it);
        it joins the queue ``frontend_s`` later, and the poll then starts a step if none runs."""
        if self.frontend_s == 0:
            self.engine.add(req)
        else:
            self.engine.add(req, arriving=True)
            self.arriving.append((now + self.frontend_s, req.id))
        if self.run is not None:
            self._cut(now + self.frontend_s)

    def abort(self, request_id: str, now: float | None = None) -> bool:
        """Drop a request. In a decode run, ``now`` is needed (the run is polled up to it): the
        step under way at ``now`` becomes an ordinary step and the run ends there."""
        if self.run is not None:
            self._split(now)
        return self.engine.abort(request_id)

    def kv_usage(self, now: float) -> float:
        """The engine's KV usage at ``now`` (the pool's, in a decode run with the blocks of the
        steps started by ``now`` that the run has not applied yet)."""
        pool = self.engine.pool
        run = self.run
        if run is None:
            return pool.usage
        started = min(self.series.ended(now) + 1, run.steps) - run.done
        bs = self.engine.config.block_size
        extra = sum(max(0, -(-(seq.computed + started) // bs) - len(seq.blocks)) for seq in run.seqs)
        return 1.0 - (len(pool.free) - extra) / pool.num_blocks

    def _admit(self, until: float) -> None:
        while self.arriving and self.arriving[0][0] <= until:
            self.engine.admit(self.arriving.popleft()[1])

    def _start(self, at: float) -> None:
        if self.fast_forward:
            run = self.engine.decode_run(self.max_run)
            if run is not None and self._plan(run, at):
                return
        step = self.engine.schedule()
        if step is not None:
            self.step, self.started_at, self.ends_at = step, at, at + step.seconds
            self.steps += 1

    def _plan(self, run: DecodeRun, at: float) -> bool:
        """Time the run's steps from ``at`` (the step under way when an arriving request joins
        is its last: the next is the first that may hold it); False for steps that take no
        time, which are left to be stepped."""
        shape, step_time = run.shape(), self.engine.step_time
        first = step_time.seconds(shape)
        if not first > 0:
            return False
        shape.kv_read += len(run.seqs)
        self.series = series = Series(at, first, max(0.0, step_time.seconds(shape) - first))
        if self.arriving:
            run.steps = min(run.steps, series.ended(self.arriving[0][0], before=True) + 1)
        self.run, self.started_at, self.ends_at = run, at, series.end(run.steps)
        self.runs += 1
        return True

    def _cut(self, joins: float) -> None:
        """A request joins the queue at ``joins``: the run ends with the step under way then
        (or the next to end, when one ends right then)."""
        run = self.run
        steps = max(self.series.ended(joins, before=True), run.done) + 1
        if steps < run.steps:
            run.steps = steps
            self.ends_at = self.series.end(steps)

    def _advance(self, until: float) -> RunOutput | None:
        """Apply the run's steps that have ended by ``until``; the run ends with its last."""
        run = self.run
        d = run.done
        m = min(self.series.ended(until), run.steps) - d
        if m <= 0:
            return None
        ids = [seq.req.id for seq in run.seqs]
        finished, events = self.engine.advance(run, m)
        self.run_steps += m
        if run.done == run.steps:
            self.run = None
        return RunOutput(ids, self.series, d, m, finished, events)

    def _split(self, now: float | None) -> None:
        run = self.run
        if now is None or self.series.end(run.done + 1) <= now:
            raise ValueError("in a decode run, abort needs the time, with the run polled up to it")
        start = self.series.end(run.done)
        step = self.engine.run_step(run)
        self.run = None
        self.step, self.started_at, self.ends_at = step, start, start + step.seconds
        self.steps += 1

    def poll(self, now: float) -> StepOutput | RunOutput | None:
        """Complete the step that ended by ``now`` (its output, else None) and start the next;
        each step starts at the earliest moment it could (the previous step's end, or the
        arrival that found the engine idle), however late the poll. In a decode run: the run's
        steps that ended by ``now`` (all of them when the run has ended, and the next starts)."""
        out: StepOutput | RunOutput | None = None
        if self.run is not None:
            if now < self.ends_at:
                out = self._advance(now)
                self._admit(now)
                return out
            self._admit(self.ends_at)
            out = self._advance(self.ends_at)
            self._start(self.ends_at)
        elif self.step is not None:
            if now < self.ends_at:
                self._admit(now)
                return None
            self._admit(self.ends_at)
            out = self.engine.complete(self.step)
            self.step = None
            self._start(self.ends_at)
        while self.step is None and self.run is None and self.arriving and self.arriving[0][0] <= now:
            at = self.arriving[0][0]
            self._admit(at)
            self._start(at)
        self._admit(now)
        if self.step is None and self.run is None:
            self._start(now)
        return out


def replay(loop: EngineLoop, arrivals: Sequence[tuple[float, LlmRequest]],
           events: list | None = None) -> dict[str, list[float]]:
    """Each request's token times when ``arrivals`` (time, request; sorted by time) come to
    ``loop`` in virtual time, steps back to back: a token is stamped with the end of the step
    that made it; a request arriving as a step ends is in the queue the next step starts from.
    ``events``, when given, collects the engine's KV events in order."""
    times: dict[str, list[float]] = {r.id: [] for _, r in arrivals}
    k, n = 0, len(arrivals)
    while k < n or loop.wake is not None:
        now = min(arrivals[k][0] if k < n else math.inf, loop.wake if loop.wake is not None else math.inf)
        while k < n and arrivals[k][0] <= now:
            loop.add(arrivals[k][1], arrivals[k][0])
            k += 1
        out = loop.poll(now)
        if isinstance(out, RunOutput):
            for rid in out.ids:
                times[rid] += out.ends
        elif out is not None:
            for rid, _ in out.tokens:
                times[rid].append(now)
        if events is not None and out is not None:
            events += out.events
    return times
