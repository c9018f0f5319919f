"""Generative workloads: when each request is sent, how long its prompt is, how many tokens it
asks for, and its prompt's token ids.

Sources:
- the Azure LLM inference trace 2023 (``TIMESTAMP, ContextTokens, GeneratedTokens``): each prompt
  is distinct seeded random token ids, so nothing is shared between requests;
- the Mooncake trace (JSONL: ``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``
  per 512-token block): each hash id is one fixed block of 512 token ids, so two requests with
  the same leading hash ids share that prefix exactly and an engine's prefix cache sees the
  trace's reuse (the last block is cut to ``input_length``);
- Poisson or Gamma(rate, cv) arrivals (:mod:`loadgen.arrivals`) with input and output lengths
  drawn from a :class:`LengthDist` (fixed, uniform, lognormal, or a trace's lengths);
- the shared-prefix shape of llm-d's prefix-cache routing benchmark (:func:`shared_prefix`):
  tenants, each with one system prompt all its requests share, and a question per request.

A trace is replayed from a window (``start_s`` into the trace, ``duration_s`` of replay or the
first ``requests``), its time compressed by ``rate_scale`` (2 sends twice as fast), and lengths
capped at a context limit. Token ids lie in ``[16, vocab_size)``, the range the emulated engine's
tokenizer produces (:mod:`profiles.llm.tokens`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loadgen.arrivals import TraceError, make_process, times
from profiles.llm.tokens import decode

BLOCK_TOKENS = 512  # tokens per Mooncake hash id
FIRST_ID = 16  # token ids below this are special in the emulated tokenizer
DEFAULT_VOCAB = 32000  # within every Llama tokenizer's vocabulary
AZURE_LLM_FILE = "azure_llm_2023_conv.csv"
MOONCAKE_FILE = "mooncake_conversation.jsonl"
TRACES = {"azure-llm": AZURE_LLM_FILE, "mooncake": MOONCAKE_FILE}
AZURE_LLM_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True)
class TraceRows:
    """A trace as read: arrival times (s from its first request), lengths, Mooncake's block
    hash ids (empty tuples for a trace without them), and each request's tenant where the
    workload has tenants (None otherwise)."""

    times: np.ndarray  # float64, non-decreasing
    input_len: np.ndarray  # int64
    output_len: np.ndarray  # int64
    hash_ids: tuple[tuple[int, ...], ...]
    tenant: np.ndarray | None = None  # int64 group of each request

    def __len__(self) -> int:
        return len(self.times)

    def take(self, sel: slice | np.ndarray) -> TraceRows:
        idx = np.arange(len(self))[sel]
        return TraceRows(self.times[idx], self.input_len[idx], self.output_len[idx],
                         tuple(self.hash_ids[i] for i in idx) if self.hash_ids else (),
                         None if self.tenant is None else self.tenant[idx])


def _positive(path: Path, n: int, name: str, text: str) -> int:
    try:
        v = int(text)
    except (TypeError, ValueError):
        raise TraceError(f"{path}:{n}: {name} {text!r} is not an integer") from None
    if v < 1:
        raise TraceError(f"{path}:{n}: {name} must be >= 1, got {v}")
    return v


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except OSError as e:
        raise TraceError(f"{path}: cannot read trace: {e.strerror}") from None


def _check_times(path: Path, t: np.ndarray, first_line: int) -> np.ndarray:
    back = np.flatnonzero(np.diff(t) < 0)
    if len(back):
        raise TraceError(f"{path}:{first_line + int(back[0]) + 1}: timestamp is before the previous one")
    return t - t[0]


def read_azure_llm(path: str | Path) -> TraceRows:
    """The Azure LLM inference trace 2023 (``TIMESTAMP,ContextTokens,GeneratedTokens``, time as
    ``2023-11-16 18:15:46.6805900``). Raises :class:`TraceError` naming the first bad line."""
    path = Path(path)
    lines = _lines(path)
    if not lines or tuple(h.strip() for h in lines[0].split(",")) != AZURE_LLM_HEADER:
        got = lines[0][:80] if lines else "an empty file"
        raise TraceError(f"{path}:1: header must be {','.join(AZURE_LLM_HEADER)}, got {got!r}")
    stamps, ins, outs = [], [], []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cells = line.split(",")
        if len(cells) != 3:
            raise TraceError(f"{path}:{n}: expected 3 columns, got {len(cells)}")
        stamps.append(cells[0].strip())
        ins.append(_positive(path, n, "ContextTokens", cells[1]))
        outs.append(_positive(path, n, "GeneratedTokens", cells[2]))
    if not stamps:
        raise TraceError(f"{path}: no requests after the header")
    try:
        t = np.array(stamps, dtype="datetime64[ns]")
    except ValueError:
        bad = next(i for i, s in enumerate(stamps) if not _is_time(s))
        raise TraceError(f"{path}:{bad + 2}: TIMESTAMP {stamps[bad]!r} is not a date and time") from None
    secs = (t - t[0]).astype(np.int64) / 1e9
    return TraceRows(_check_times(path, secs, 2), np.array(ins), np.array(outs), ())


def _is_time(s: str) -> bool:
    try:
        np.datetime64(s, "ns")
    except ValueError:
        return False
    return True


def read_mooncake(path: str | Path) -> TraceRows:
    """The Mooncake trace: one JSON object a line with ``timestamp`` (ms), ``input_length``,
    ``output_length`` and ``hash_ids`` (one per 512-token block of the prompt)."""
    path = Path(path)
    stamps, ins, outs, hashes = [], [], [], []
    first = 0
    for n, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        first = first or n
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{path}:{n}: not JSON: {e.msg}") from None
        if not isinstance(d, dict) or not {"timestamp", "input_length", "output_length", "hash_ids"} <= d.keys():
            raise TraceError(f"{path}:{n}: want an object with timestamp, input_length, output_length, hash_ids")
        if not isinstance(d["timestamp"], int | float) or d["timestamp"] < 0:
            raise TraceError(f"{path}:{n}: timestamp {d['timestamp']!r} is not a number >= 0 (ms)")
        size = _positive(path, n, "input_length", d["input_length"])
        ids = d["hash_ids"]
        if not isinstance(ids, list) or not all(isinstance(h, int) and h >= 0 for h in ids):
            raise TraceError(f"{path}:{n}: hash_ids must be a list of integers >= 0")
        if len(ids) != -(-size // BLOCK_TOKENS):
            raise TraceError(f"{path}:{n}: {len(ids)} hash_ids for input_length {size}: want one per "
                             f"{BLOCK_TOKENS}-token block ({-(-size // BLOCK_TOKENS)})")
        stamps.append(float(d["timestamp"]) / 1e3)
        ins.append(size)
        outs.append(_positive(path, n, "output_length", d["output_length"]))
        hashes.append(tuple(ids))
    if not stamps:
        raise TraceError(f"{path}: no requests")
    return TraceRows(_check_times(path, np.array(stamps), first), np.array(ins), np.array(outs), tuple(hashes))


def trace_path(kind: str, traces_dir: str | Path) -> Path:
    """The shared trace file of ``kind`` (``azure-llm`` or ``mooncake``) under ``traces_dir``."""
    if kind not in TRACES:
        raise ValueError(f"unknown trace {kind!r}; known: {', '.join(TRACES)}")
    path = Path(traces_dir) / TRACES[kind]
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file (give the folder holding {TRACES[kind]} with --traces-dir)")
    return path


def read_trace(kind: str, traces_dir: str | Path) -> TraceRows:
    path = trace_path(kind, traces_dir)
    return read_mooncake(path) if kind == "mooncake" else read_azure_llm(path)


# ---- length distributions ------------------------------------------------------------------


@dataclass(frozen=True)
class LengthDist:
    """Token counts: ``fixed:N`` (or ``N``), ``uniform:LO:HI`` (inclusive), ``lognormal:MEDIAN:SIGMA``
    (sigma of the log), or ``trace:azure-llm`` / ``trace:mooncake`` (drawn from that trace's
    input or output lengths). Every draw is at least 1."""

    kind: str
    a: float = 0.0
    b: float = 0.0
    pool: tuple[int, ...] = ()  # a trace's lengths

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            out = np.full(n, self.a)
        elif self.kind == "uniform":
            out = rng.integers(int(self.a), int(self.b) + 1, n)
        elif self.kind == "lognormal":
            out = np.rint(rng.lognormal(np.log(self.a), self.b, n))
        else:
            out = rng.choice(np.asarray(self.pool), n)
        return np.maximum(out, 1).astype(np.int64)


def parse_length(text: str, which: str, traces_dir: str | Path) -> LengthDist:
    """A :class:`LengthDist` from its text; ``which`` (input or output) picks a trace's column."""
    kind, _, rest = text.partition(":")
    args = rest.split(":") if rest else []
    if kind.isdigit() and not rest:
        kind, args = "fixed", [text]
    want = {"fixed": 1, "uniform": 2, "lognormal": 2, "trace": 1}
    if kind not in want or len(args) != want[kind]:
        raise ValueError(f"bad length {text!r}: want N, fixed:N, uniform:LO:HI, lognormal:MEDIAN:SIGMA "
                         f"or trace:{'|'.join(TRACES)}")
    if kind == "trace":
        rows = read_trace(args[0], traces_dir)
        return LengthDist("trace", pool=tuple(int(x) for x in (rows.input_len if which == "input" else rows.output_len)))
    try:
        nums = [float(x) for x in args]
    except ValueError:
        raise ValueError(f"bad length {text!r}: {':'.join(args)} are not numbers") from None
    if kind == "uniform" and not 1 <= nums[0] <= nums[1]:
        raise ValueError(f"bad length {text!r}: want 1 <= LO <= HI")
    if kind != "uniform" and not (nums[0] >= 1 and all(np.isfinite(nums))):
        raise ValueError(f"bad length {text!r}: the length must be >= 1")
    if kind == "lognormal" and not nums[1] >= 0:
        raise ValueError(f"bad length {text!r}: SIGMA must be >= 0")
    return LengthDist(kind, nums[0], nums[1] if len(nums) > 1 else 0.0)


# ---- workloads -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """Requests to send: time (s from the run's start), prompt length, output length, and for a
    Mooncake replay each prompt's block hash ids. Prompts are built by :meth:`prompt`."""

    name: str
    rows: TraceRows
    seed: int = 0
    vocab_size: int = DEFAULT_VOCAB

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def span_s(self) -> float:
        return float(self.rows.times[-1]) if len(self.rows) else 0.0

    def block(self, hash_id: int) -> np.ndarray:
        """The 512 token ids of one Mooncake hash id: the same ids for the same hash id and seed."""
        return np.random.default_rng([self.seed, 1, hash_id]).integers(
            FIRST_ID, self.vocab_size, BLOCK_TOKENS, dtype=np.int64)

    def prompt(self, i: int, blocks: BlockCache | None = None) -> list[int]:
        """Request ``i``'s prompt token ids, exactly ``input_len[i]`` of them (Mooncake blocks
        taken from ``blocks`` when given)."""
        size = int(self.rows.input_len[i])
        if self.rows.hash_ids:
            block = self.block if blocks is None else blocks.get
            ids = np.concatenate([block(h) for h in self.rows.hash_ids[i]])
        else:
            ids = np.random.default_rng([self.seed, 2, i]).integers(FIRST_ID, self.vocab_size, size, dtype=np.int64)
        return ids[:size].tolist()

    def prompt_text(self, i: int) -> str:
        """The same prompt as text: one word per token id, each a single token to the emulated
        engine's tokenizer, so equal ids give equal text and shared prefixes stay shared."""
        return decode(self.prompt(i)).lstrip()


class BlockCache:
    """The Mooncake blocks a workload built last (at most ``size`` of them, 2 KB each), so
    prompts that share blocks are built faster: ``Workload.prompt(i, cache)``."""

    def __init__(self, work: Workload, size: int) -> None:
        if size < 1:
            raise ValueError(f"a block cache holds at least one block, got {size}")
        self.work, self.size = work, size
        self.blocks: OrderedDict[int, np.ndarray] = OrderedDict()
        self.small = work.vocab_size <= np.iinfo(np.int32).max

    def get(self, hash_id: int) -> np.ndarray:
        ids = self.blocks.get(hash_id)
        if ids is None:
            ids = self.work.block(hash_id)
            if self.small:
                ids = ids.astype(np.int32)
            self.blocks[hash_id] = ids
            if len(self.blocks) > self.size:
                self.blocks.popitem(last=False)
        else:
            self.blocks.move_to_end(hash_id)
        return ids


def window(rows: TraceRows, start_s: float = 0.0, duration_s: float | None = None,
           requests: int | None = None, rate_scale: float = 1.0) -> TraceRows:
    """The requests from ``start_s`` into the trace on, sent ``rate_scale`` times as fast, for
    ``duration_s`` of replay and/or the first ``requests`` of them; times start at the window's
    start."""
    if not rate_scale > 0:
        raise ValueError(f"rate scale must be > 0, got {rate_scale}")
    if start_s < 0:
        raise ValueError(f"window start must be >= 0 s, got {start_s}")
    t = rows.times
    sel = t >= start_s
    if duration_s is not None:
        sel &= t < start_s + duration_s * rate_scale
    idx = np.flatnonzero(sel)
    if requests is not None:
        idx = idx[:requests]
    if not len(idx):
        raise ValueError(f"no requests in the window starting {start_s:g} s into the trace "
                         f"(it spans {float(t[-1]):.1f} s)")
    out = rows.take(idx)
    return TraceRows((out.times - start_s) / rate_scale, out.input_len, out.output_len, out.hash_ids, out.tenant)


def cap_context(rows: TraceRows, max_context: int | None) -> TraceRows:
    """Lengths cut so that prompt + output fits ``max_context``: a prompt keeps at most
    ``max_context - 1`` tokens (a Mooncake prompt its leading blocks), the output the rest."""
    if max_context is None:
        return rows
    if max_context < 2:
        raise ValueError(f"context limit must be >= 2 tokens, got {max_context}")
    ins = np.minimum(rows.input_len, max_context - 1)
    outs = np.minimum(rows.output_len, max_context - ins)
    hashes = tuple(h[: -(-int(n) // BLOCK_TOKENS)] for h, n in zip(rows.hash_ids, ins, strict=True)) \
        if rows.hash_ids else ()
    return TraceRows(rows.times, ins, outs, hashes, rows.tenant)


def _arrivals(arrival: str, rate: float, cv: float, duration_s: float | None, requests: int | None,
              seed: int) -> tuple[np.ndarray, np.random.Generator]:
    """Poisson or Gamma(rate, cv) send times for ``duration_s`` (or until ``requests``), and the
    generator that drew them, for the draws that follow."""
    rng = np.random.default_rng(seed)
    proc = make_process(arrival, rate, cv)
    if duration_s is None and requests is None:
        raise ValueError("a synthetic workload needs a duration or a request count")
    horizon = duration_s if duration_s is not None else 2.0 * requests / rate + 10.0  # type: ignore[operator]
    t = times(proc, horizon, rng)
    while requests is not None and duration_s is None and len(t) < requests:
        horizon *= 2
        t = times(proc, horizon, np.random.default_rng(seed))
    if requests is not None:
        t = t[:requests]
    if not len(t):
        raise ValueError(f"no arrivals at {rate:g}/s in {duration_s:g} s")
    return t, rng


def synthetic(arrival: str, rate: float, cv: float, duration_s: float | None, requests: int | None,
              input_len: LengthDist, output_len: LengthDist, seed: int) -> TraceRows:
    """Poisson or Gamma(rate, cv) arrivals for ``duration_s`` (or until ``requests``), lengths
    drawn from the two distributions; all seeded."""
    t, rng = _arrivals(arrival, rate, cv, duration_s, requests, seed)
    return TraceRows(t, input_len.sample(rng, len(t)), output_len.sample(rng, len(t)), ())


# llm-d's shared-prefix benchmark (llm-d/llm-d@220684036d0bb8b55f04c2674dc084923dac1e91,
# guides/precise-prefix-cache-aware/benchmark-templates/guide.yaml, inference-perf's shared_prefix
# data): num_groups 150, system_prompt_len 6000, question_len 1200, output_len 1000,
# num_prompts_per_group 5. The system prompt here is whole 512-token blocks (Mooncake's hash id
# scheme builds the prompts), so 6000 becomes 6144, the nearest.
SHARED_TENANTS = 150
SHARED_SYSTEM_LEN = 12 * BLOCK_TOKENS
SHARED_QUESTION_LEN = 1200
SHARED_OUTPUT_LEN = 1000


def shared_prefix(arrival: str, rate: float, cv: float, duration_s: float | None, requests: int | None,
                  output_len: LengthDist, seed: int, tenants: int = SHARED_TENANTS,
                  system_len: int = SHARED_SYSTEM_LEN, question_len: int = SHARED_QUESTION_LEN,
                  questions: int | None = None) -> TraceRows:
    """llm-d's shared-prefix shape: Poisson or Gamma arrivals, each request of a tenant drawn
    uniformly from ``tenants``; its prompt is the tenant's system prompt (``system_len`` tokens,
    whole 512-token blocks, shared by all the tenant's requests) and then a question of
    ``question_len`` tokens: its own (``questions`` None), or one of the tenant's ``questions``
    drawn uniformly (inference-perf's ``num_prompts_per_group``). Written as Mooncake hash ids:
    system blocks first, then the question's, which no other tenant or question uses."""
    if tenants < 1 or question_len < 1 or (questions is not None and questions < 1):
        raise ValueError(f"shared prefix: tenants ({tenants}), question_len ({question_len}) and questions "
                         f"({questions}) must be at least 1")
    if system_len < BLOCK_TOKENS or system_len % BLOCK_TOKENS:
        raise ValueError(f"shared prefix: system_len ({system_len}) must be whole {BLOCK_TOKENS}-token blocks")
    t, rng = _arrivals(arrival, rate, cv, duration_s, requests, seed)
    n = len(t)
    tenant = rng.integers(0, tenants, n)
    outs = output_len.sample(rng, n)
    sys_blocks, q_blocks = system_len // BLOCK_TOKENS, -(-question_len // BLOCK_TOKENS)
    question = np.arange(n) if questions is None else tenant * questions + rng.integers(0, questions, n)
    first_q = tenants * sys_blocks  # question blocks come after every tenant's system blocks
    hashes = tuple(tuple(range(g * sys_blocks, (g + 1) * sys_blocks))
                   + tuple(range(first_q + q * q_blocks, first_q + (q + 1) * q_blocks))
                   for g, q in zip(tenant.tolist(), question.tolist(), strict=True))
    return TraceRows(t, np.full(n, system_len + question_len, dtype=np.int64), outs, hashes, tenant.astype(np.int64))
