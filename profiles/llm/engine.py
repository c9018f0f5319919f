"""The LLM engine model: continuous batching over a paged KV cache, as vLLM's v1 scheduler does it.

One :class:`Engine` is one model replica (a GPU, a MIG slice or a tensor-parallel group). Its
driver repeats: ``step = engine.schedule()``; let ``step.seconds`` pass (in real time for the
emulated engine, in virtual time for the simulator); ``engine.complete(step)``, which returns
the tokens the step produced. Requests come in with :meth:`Engine.add` and leave when they have
their ``max_tokens`` or with :meth:`Engine.abort`, at any moment between two calls.

Each step, as vLLM's v1 scheduler (``vllm/v1/core/sched/scheduler.py``, FCFS policy):
- a token budget (``max_num_batched_tokens``) is shared by the running requests first, in
  order: a decoding request takes one token, a prefilling one its next chunk (chunked prefill);
- a running request whose KV does not fit preempts the last running request (its blocks freed,
  its KV recomputed when it runs again, its tokens kept), itself if it is the last;
- then, if nothing was preempted, waiting requests start in arrival order while budget, KV
  blocks and ``max_num_seqs`` allow, each first taking the longest cached prefix of its tokens
  from the prefix cache (never the whole prompt: its last token is always computed);
- a request whose tokens are all computed after the step samples one token.

A stretch of steps that only decode the same running requests, with no waiting request able to
start, can be taken as one :class:`DecodeRun` (:meth:`Engine.decode_run`, :meth:`Engine.advance`):
the same blocks allocated and named in the same order, the same tokens and counters, without the
per-step scheduling (the simulator's fast-forward, :class:`profiles.llm.loop.EngineLoop`).

Sans-IO: no clock, no I/O. Tokens are deterministic given each request's seed.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from profiles.llm.kv import BLOCK_SIZE, ROOT_HASH, BlockPool, KvEvent, block_hashes
from profiles.llm.steptime import StepShape, StepTime


class RequestTooLong(ValueError):
    """The prompt and ``max_tokens`` do not fit the model's context. The numbers are kept so a
    server can word the error as the engine it stands for does."""

    def __init__(self, prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
        self.prompt_tokens, self.max_tokens, self.max_model_len = prompt_tokens, max_tokens, max_model_len
        super().__init__(f"this model's maximum context length is {max_model_len} tokens, but the request has "
                         f"{prompt_tokens} input tokens and asks for {max_tokens} more")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One replica's scheduler and KV cache (vLLM's ``SchedulerConfig`` and ``CacheConfig``)."""

    num_blocks: int  # KV blocks: what the device's memory holds after weights and activations
    max_model_len: int
    block_size: int = BLOCK_SIZE
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    prefix_caching: bool = True
    chunked_prefill: bool = True
    vocab_size: int = 32000
    kv_events: bool = True  # publish KV cache events (vLLM's --kv-events-config); off, none are kept

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1 or self.max_model_len < 1:
            raise ValueError("max_num_batched_tokens, max_num_seqs and max_model_len must be at least 1")
        if not self.chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(f"without chunked prefill, max_num_batched_tokens ({self.max_num_batched_tokens}) "
                             f"must hold a whole prompt of max_model_len ({self.max_model_len})")


@dataclass(frozen=True, slots=True)
class LlmRequest:
    id: str
    prompt: Sequence[int]  # token ids
    max_tokens: int
    seed: int = 0
    # the prompt's full-block hashes (profiles.llm.kv.block_hashes at the engine's block size),
    # when the caller has them already: the engine takes them instead of hashing the prompt again
    hashes: Sequence[int] = ()


class State(enum.StrEnum):
    ARRIVING = "arriving"  # on its way in through the server's front end: no step sees it yet
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(slots=True)
class Seq:
    """The engine's view of one request."""

    req: LlmRequest
    tokens: list[int]  # the prompt, then every token sampled so far
    state: State = State.WAITING
    computed: int = 0  # tokens whose KV is in this request's blocks
    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)  # of every full block of ``tokens`` hashed so far
    committed: int = 0  # leading blocks named in the prefix cache
    output: int = 0
    cached_tokens: int = 0  # prompt tokens its first start found in the prefix cache
    started: bool = False
    preemptions: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)


@dataclass(slots=True)
class Step:
    """One scheduled step: who runs how many tokens, its shape, and how long it takes."""

    scheduled: list[tuple[Seq, int]]
    shape: StepShape
    seconds: float
    preempted: list[str]


@dataclass(slots=True)
class StepOutput:
    tokens: list[tuple[str, int]]  # (request id, token) sampled by the step, in schedule order
    finished: list[str]
    events: list[KvEvent]


@dataclass(slots=True)
class DecodeRun:
    """Steps in a row, each of which decodes every one of ``seqs`` (in running order) and
    nothing else: ``steps`` of them at most, ``done`` applied so far by :meth:`Engine.advance`."""

    seqs: list[Seq]
    steps: int
    done: int = 0

    def shape(self) -> StepShape:
        """The shape of the next step to apply."""
        shape = StepShape()
        for seq in self.seqs:
            shape.add_decode(seq.num_tokens)
        return shape


@dataclass(slots=True)
class Counters:
    """Totals since start, named as vLLM's Prometheus counters count them."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    prefix_queries: int = 0  # tokens looked up in the prefix cache
    prefix_hits: int = 0
    finished: int = 0
    aborted: int = 0


def _token(seed: int, position: int, vocab: int) -> int:
    """A token that depends only on the request's seed and its position (splitmix64)."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 1) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) % vocab


class Engine:
    def __init__(self, config: EngineConfig, step_time: StepTime) -> None:
        self.config = config
        self.step_time = step_time
        self.pool = BlockPool(config.num_blocks, config.block_size, config.prefix_caching, config.kv_events)
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.seqs: dict[str, Seq] = {}
        self.counters = Counters()

    # requests in and out

    def check(self, prompt_tokens: int, max_tokens: int) -> None:
        """Raise :class:`RequestTooLong` when a request cannot fit the context; ValueError when it
        asks for no token or has no prompt."""
        if prompt_tokens < 1:
            raise ValueError("the prompt must hold at least one token")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        if prompt_tokens + max_tokens > self.config.max_model_len:
            raise RequestTooLong(prompt_tokens, max_tokens, self.config.max_model_len)

    def add(self, req: LlmRequest, arriving: bool = False) -> None:
        """Queue a request; ``arriving``: held out of the schedule until :meth:`admit`."""
        if req.id in self.seqs:
            raise ValueError(f"request {req.id!r} is already in the engine")
        self.check(len(req.prompt), req.max_tokens)
        seq = Seq(req, list(req.prompt))
        if req.hashes:
            if len(req.hashes) != len(req.prompt) // self.config.block_size:
                raise ValueError(f"request {req.id!r}: {len(req.hashes)} block hashes for a prompt of "
                                 f"{len(req.prompt)} tokens in blocks of {self.config.block_size}")
            seq.hashes = list(req.hashes)
        self.seqs[req.id] = seq
        if arriving:
            seq.state = State.ARRIVING
        else:
            self.waiting.append(seq)

    def admit(self, request_id: str) -> None:
        """An arriving request joins the waiting queue (nothing when it was aborted meanwhile)."""
        seq = self.seqs.get(request_id)
        if seq is not None and seq.state is State.ARRIVING:
            seq.state = State.WAITING
            self.waiting.append(seq)

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is and free its KV blocks; False when it is not here."""
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return False
        if seq.state is State.RUNNING:
            self.running.remove(seq)
        elif seq.state is State.WAITING:
            self.waiting.remove(seq)
        self.pool.release(seq.blocks)
        seq.blocks = []
        seq.state = State.ABORTED
        self.counters.aborted += 1
        return True

    @property
    def idle(self) -> bool:
        return not self.seqs

    # the step

    def schedule(self) -> Step | None:
        """The next step, with its requests' KV allocated; None when nothing can run."""
        cfg, pool = self.config, self.pool
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[Seq, int]] = []
        preempted: list[str] = []
        for seq in self.running[:]:
            if budget == 0 or seq.state is not State.RUNNING:
                break
            n = min(seq.num_tokens - seq.computed, budget)
            if not self._fit(seq, n, preempted):
                break
            self._commit(seq, seq.computed + n)
            scheduled.append((seq, n))
            budget -= n
        while not preempted and self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            seq = self.waiting[0]
            self._hash(seq, seq.num_tokens)
            hit = pool.lookup(seq.hashes, (seq.num_tokens - 1) // cfg.block_size)
            computed = len(hit) * cfg.block_size
            n = seq.num_tokens - computed
            if not cfg.chunked_prefill and n > budget:
                break
            n = min(n, budget)
            need = -(-(computed + n) // cfg.block_size) - len(hit)
            if need + sum(1 for b in hit if pool.refs[b] == 0) > pool.num_free:
                break
            pool.take(hit)
            seq.blocks = hit + (pool.allocate(need) or [])
            seq.computed = computed
            seq.committed = len(hit)
            self._commit(seq, computed + n)
            if not seq.started:
                seq.started = True
                seq.cached_tokens = computed
                self.counters.prefix_queries += seq.num_tokens
                self.counters.prefix_hits += computed
            self.waiting.popleft()
            seq.state = State.RUNNING
            self.running.append(seq)
            scheduled.append((seq, n))
            budget -= n
        if not scheduled:
            return None
        shape = StepShape()
        for seq, n in scheduled:
            if seq.output and seq.computed == seq.num_tokens - 1:
                shape.add_decode(seq.num_tokens)
            else:
                shape.add_prefill(seq.computed, n, seq.computed + n == seq.num_tokens)
        self.counters.preemptions += len(preempted)
        return Step(scheduled, shape, self.step_time.seconds(shape), preempted)

    def complete(self, step: Step) -> StepOutput:
        """Apply a step that has run: its tokens computed, one sampled by each request that has
        all its tokens computed, finished requests' blocks freed (their cached blocks stay
        cached until evicted). Requests aborted since the step was scheduled are skipped."""
        tokens: list[tuple[str, int]] = []
        finished: list[str] = []
        c = self.counters
        for seq, n in step.scheduled:
            if seq.state is not State.RUNNING:
                continue
            seq.computed += n
            if seq.computed < seq.num_tokens:
                continue
            tok = _token(seq.req.seed, seq.output, self.config.vocab_size)
            seq.tokens.append(tok)
            if seq.output == 0:
                c.prompt_tokens += len(seq.req.prompt)
            seq.output += 1
            c.generation_tokens += 1
            tokens.append((seq.req.id, tok))
            if seq.output >= seq.req.max_tokens:
                self._finish(seq)
                finished.append(seq.req.id)
        return StepOutput(tokens, finished, self.pool.drain())

    def _finish(self, seq: Seq) -> None:
        self.running.remove(seq)
        self.pool.release(seq.blocks)
        seq.blocks = []
        seq.state = State.FINISHED
        del self.seqs[seq.req.id]
        self.counters.finished += 1

    # decode runs

    def decode_run(self, limit: int) -> DecodeRun | None:
        """The next steps as one run, when :meth:`schedule` would make each of them a step that
        only decodes every running request: each has all its tokens computed but the one it
        sampled last, they fit the token budget, and no waiting request could start (none waits,
        or the first is held by ``max_num_seqs``, the token budget, or KV blocks that the run's
        steps only take more of). The run stops at ``limit`` steps, at the step where a request
        takes its last token, before a step whose blocks the pool cannot give (that step
        preempts, as :meth:`schedule` will), and before a step that names a block the first
        waiting request could find cached. None when no such step comes next."""
        cfg, pool = self.config, self.pool
        running = self.running
        b = len(running)
        if not running or b > cfg.max_num_batched_tokens:
            return None
        steps = limit
        for seq in running:
            if not seq.output or seq.computed != seq.num_tokens - 1:
                return None
            steps = min(steps, seq.req.max_tokens - seq.output)
        if self.waiting:
            held = self._held_for(b, steps)
            if held is None:
                return None
            steps = held
        if self._blocks_for(steps) > pool.num_free:  # the largest run the free blocks allow
            lo, hi = 0, steps
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if self._blocks_for(mid) <= pool.num_free else (lo, mid - 1)
            steps = lo
        if steps < 1:
            return None
        return DecodeRun(list(running), steps)

    def _blocks_for(self, steps: int) -> int:
        """Fresh blocks the running requests take in ``steps`` decode steps."""
        bs = self.config.block_size
        return sum(max(0, -(-(seq.computed + steps) // bs) - len(seq.blocks)) for seq in self.running)

    def _held_for(self, running: int, steps: int) -> int | None:
        """Of ``steps`` decode steps of ``running`` requests, how many keep the first waiting
        request out, as :meth:`schedule` decides it; None when it could start at the next."""
        cfg, pool, bs = self.config, self.pool, self.config.block_size
        budget = cfg.max_num_batched_tokens - running
        if budget <= 0 or running >= cfg.max_num_seqs:
            return steps
        head = self.waiting[0]
        self._hash(head, head.num_tokens)
        limit = (head.num_tokens - 1) // bs
        hit = pool.lookup(head.hashes, limit)
        # what it would take with the first i blocks of its hit: evictions only shorten the hit,
        # and a shorter hit with fewer free blocks (one went to the eviction) must hold it too
        free_hits = 0
        for i in range(len(hit) + 1):
            n = head.num_tokens - i * bs
            if cfg.chunked_prefill or n <= budget:
                need = -(-(i * bs + min(n, budget)) // bs) - i + free_hits
                if need <= pool.num_free - (i < len(hit)):
                    return None
            if i < len(hit):
                free_hits += pool.refs[hit[i]] == 0
        # its hit grows only when a running request names the block after it, which one whose
        # named blocks are the head's own prefix may do: the run stops before that step
        q = len(hit)
        if q < limit and cfg.prefix_caching:
            for seq in self.running:
                c = seq.committed
                if c <= q and (c == 0 or seq.hashes[c - 1] == head.hashes[c - 1]):
                    names_q = (q + 1) * bs - seq.computed - 1  # the step that fills its block q
                    if names_q >= 0:
                        steps = min(steps, names_q)
        return steps

    def advance(self, run: DecodeRun, steps: int) -> tuple[list[str], list[KvEvent]]:
        """Apply the next ``steps`` steps of ``run`` as :meth:`schedule` and :meth:`complete`
        would, one after the other: each running request's blocks allocated and named in step
        order, one token sampled by each a step; a request with all its tokens finishes. Returns
        the finished requests and the KV events of those steps."""
        if not 0 < steps <= run.steps - run.done:
            raise ValueError(f"a run of {run.steps} steps has {run.steps - run.done} left, not {steps}")
        pool, bs, vocab = self.pool, self.config.block_size, self.config.vocab_size
        todo: list[tuple[int, int, int]] = []  # (step, request, 0 allocate / 1 name blocks)
        for i, seq in enumerate(run.seqs):
            seed, out0, c = seq.req.seed, seq.output, seq.computed
            seq.tokens += [_token(seed, o, vocab) for o in range(out0, out0 + steps)]
            x = len(seq.blocks) * bs - c  # the step whose token overflows its blocks
            while x < steps:
                todo.append((x, i, 0))
                x += bs
            if self.config.prefix_caching:
                x = (-(c + 1)) % bs  # the step whose token fills a block
                while x < steps:
                    todo.append((x, i, 1))
                    x += bs
        todo.sort()
        for x, i, kind in todo:
            seq = run.seqs[i]
            if kind == 0:
                got = pool.allocate(1)
                if got is None:
                    raise RuntimeError("a decode run outgrew the free KV blocks it was planned within")
                seq.blocks += got
            else:
                self._commit(seq, seq.computed + x + 1)
        finished = []
        for seq in run.seqs:
            seq.computed += steps
            seq.output += steps
        self.counters.generation_tokens += len(run.seqs) * steps
        run.done += steps
        for seq in run.seqs:
            if seq.output >= seq.req.max_tokens:
                self._finish(seq)
                finished.append(seq.req.id)
        return finished, pool.drain()

    def run_step(self, run: DecodeRun) -> Step:
        """The next step of ``run`` as an ordinary :class:`Step` (its blocks allocated and named,
        as :meth:`schedule` would), for :meth:`complete`; the run ends there."""
        scheduled = []
        for seq in run.seqs:
            if not self._grow(seq, 1):
                raise RuntimeError("a decode run outgrew the free KV blocks it was planned within")
            self._commit(seq, seq.computed + 1)
            scheduled.append((seq, 1))
        shape = run.shape()
        run.steps = run.done
        return Step(scheduled, shape, self.step_time.seconds(shape), [])

    # KV

    def _fit(self, seq: Seq, n: int, preempted: list[str]) -> bool:
        """KV for ``n`` more tokens of a running request, preempting from the back of the running
        list until it fits; False when the request itself had to go."""
        while not self._grow(seq, n):
            victim = self.running.pop()
            self._preempt(victim)
            preempted.append(victim.req.id)
            if victim is seq:
                return False
        return True

    def _grow(self, seq: Seq, n: int) -> bool:
        need = -(-(seq.computed + n) // self.config.block_size) - len(seq.blocks)
        if need <= 0:
            return True
        blocks = self.pool.allocate(need)
        if blocks is None:
            return False
        seq.blocks += blocks
        return True

    def _preempt(self, seq: Seq) -> None:
        self.pool.release(seq.blocks)
        seq.blocks = []
        seq.computed = 0
        seq.committed = 0
        seq.state = State.WAITING
        seq.preemptions += 1
        self.waiting.appendleft(seq)

    def _hash(self, seq: Seq, upto: int) -> None:
        """Extend ``seq.hashes`` over the full blocks of its first ``upto`` tokens."""
        full = upto // self.config.block_size
        if full > len(seq.hashes):
            bs = self.config.block_size
            parent = seq.hashes[-1] if seq.hashes else ROOT_HASH
            seq.hashes += block_hashes(seq.tokens[len(seq.hashes) * bs:full * bs], bs, parent)

    def _commit(self, seq: Seq, upto: int) -> None:
        """Name in the prefix cache the blocks that ``upto`` computed tokens fill. As in vLLM, at
        scheduling: a request scheduled later in the same step finds them."""
        full = upto // self.config.block_size
        if full <= seq.committed or not self.config.prefix_caching:
            return
        self._hash(seq, upto)
        parent = seq.hashes[seq.committed - 1] if seq.committed else ROOT_HASH
        self.pool.commit(seq.blocks[seq.committed:full], seq.hashes[seq.committed:full], parent)
        seq.committed = full
