"""What a generative model's router is made of: the router named in the config, each engine as
a :class:`~gateway.policy.llm.types.ReplicaSpec`, and each request as a
:class:`~gateway.policy.llm.types.TokenRequest`. Sans-IO; the service that drives the routers is
:mod:`gateway.llm.dispatch`.

- **Routers** (``llm_routing.router``): ``headrace`` is :class:`gateway.policy.llm.router.SloRouter`
  with the config's flow control (:func:`flow_settings`); the others are the baselines of
  :mod:`gateway.policy.llm.baselines`, made by name and seed. One router per model.
- **Engines**: a replica with a ``profile:`` gets its step time, KV blocks (the profile's engine
  at the replica's ``gpu_memory_utilization``) and front-end time from it; one without has
  ``step_time`` None, and a router that predicts does not predict for it.
- **Requests**: the prompt's token ids are what the emulated engines count
  (:func:`profiles.llm.tokens.encode`, a chat rendered by :func:`~profiles.llm.tokens.chat_prompt`;
  a completion sent as token ids is those ids), so the block hashes equal those an emulated
  engine publishes in its KV events (:func:`profiles.llm.kv.block_hashes`). Against vLLM they are
  the router's own consistent approximation of its prompt's blocks. ``max_tokens``: the body's
  (``max_completion_tokens`` first), else vLLM's defaults: 16 for a completion, the rest of the
  context for a chat.
- **Headers**: ``x-headrace-priority`` names the band (critical, standard, sheddable, or the
  KServe path's guaranteed / best-effort, mapped by :func:`~gateway.policy.llm.types.band_of`);
  ``x-headrace-tenant`` the tenant VTC fairness counts (else the body's ``user``). With API keys,
  the key's tenant is counted instead (a header cannot claim another's share), and a key whose
  tenant has a priority class puts its requests in that class's band whatever the header says
  (a header is still checked: a bad one is a 400).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, get_args

from gateway.llm.api import TPOT_HEADER, TTFT_HEADER, LlmCall, OpenAiError, slo_ms
from gateway.policy.llm.flow import FlowSettings
from gateway.policy.llm.types import Band, ReplicaSpec, RouterBase, TokenRequest, band_of
from profiles.gateway_config import LlmReplicaConfig, LlmRouterName, LlmRoutingConfig
from profiles.llm.engine import EngineConfig
from profiles.llm.kv import BLOCK_SIZE, block_hashes
from profiles.llm.profile import find_llm_profile
from profiles.llm.tokens import chat_prompt, encode
from profiles.schema import FlowControlSpec

PRIORITY_HEADER = "x-headrace-priority"
TENANT_HEADER = "x-headrace-tenant"
ROUTERS: tuple[str, ...] = get_args(LlmRouterName)
VOCAB = next(f.default for f in fields(EngineConfig) if f.name == "vocab_size")  # the emulated engines'
COMPLETION_MAX_TOKENS = 16  # vLLM's default for a completion that names none
UNKNOWN_CONTEXT = 4096  # a chat's default max_tokens is the rest of this when no engine's profile says


def make_router(routing: LlmRoutingConfig, flow: FlowControlSpec | None = None) -> RouterBase:
    """The router ``routing`` names, new (each model gets its own), headrace's holding requests
    by the gateway's ``flow`` control; ValueError for a name no router has, listing the known ones."""
    from gateway.policy.llm.routers import make

    return make(routing.router, routing.seed, flow_settings(flow or FlowControlSpec()))


def flow_settings(cfg: FlowControlSpec) -> FlowSettings:
    """The config's flow control as the router's settings (an unset queue limit: the router's)."""
    limits = dict(FlowSettings().queue_limit)
    for band in Band:
        given = getattr(cfg.queue, band.name.lower())
        if given is not None:
            limits[band] = given
    return FlowSettings(queue_limit=limits, fairness=cfg.fairness == "vtc")


# ---- engines

@dataclass(frozen=True, slots=True)
class EngineModel:
    """What a replica's profile says of its engine: the router's spec, and what requests to it
    are counted with."""

    spec: ReplicaSpec
    max_model_len: int | None = None
    vocab_size: int = VOCAB


def engine_model(replica_id: str, r: LlmReplicaConfig, base_dir: Path | None = None) -> EngineModel:
    """The replica as its router sees it; ProfileError for a profile that cannot be found or
    leaves no KV cache."""
    if r.profile is None:
        return EngineModel(ReplicaSpec(replica_id, max_inflight=r.max_inflight))
    p = find_llm_profile(r.profile, base_dir)
    cfg = p.engine_config(r.gpu_memory_utilization)
    spec = ReplicaSpec(replica_id, p.step_time, cfg.num_blocks, cfg.block_size, cfg.max_num_seqs,
                       cfg.max_num_batched_tokens, p.frontend_s, r.max_inflight)
    return EngineModel(spec, cfg.max_model_len, cfg.vocab_size)


# ---- requests

@dataclass(frozen=True, slots=True)
class LlmAsk:
    """What a request asks of its router beside its prompt: its token SLOs (seconds), band and
    tenant."""

    ttft_slo: float
    tpot_slo: float
    band: Band
    tenant: str


def read_ask(call: LlmCall, headers: Mapping[str, str], ttft_default: float, tpot_default: float,
             priority: str, key_tenant: str | None = None, key_priority: str | None = None) -> LlmAsk:
    """``call``'s SLOs (its headers', else the defaults, seconds), band and tenant.
    ``priority``: its model's class; ``key_tenant`` / ``key_priority``: its API key's tenant and
    that tenant's class (None: no key, or a key that names no class). :class:`OpenAiError`
    (400) for a bad header."""
    raw = headers.get(PRIORITY_HEADER)
    if raw is not None:
        try:
            band = band_of(raw)
        except ValueError:
            raise OpenAiError(400, f"header {PRIORITY_HEADER} must be critical, standard, sheddable, guaranteed "
                              f"or best-effort, got {raw[:40]!r}", PRIORITY_HEADER) from None
    if key_priority is not None or raw is None:
        band = band_of(key_priority or priority)
    tenant = key_tenant if key_tenant is not None else headers.get(TENANT_HEADER)
    if tenant is None:
        user = call.body.get("user")
        tenant = user if isinstance(user, str) else ""
    return LlmAsk(slo_ms(headers, TTFT_HEADER, ttft_default * 1e3), slo_ms(headers, TPOT_HEADER, tpot_default * 1e3),
                  band, tenant[:256])


def prompt_ids(call: LlmCall, vocab_size: int = VOCAB) -> tuple[list[int], int]:
    """The token ids of ``call``'s (first) prompt, and the prompt tokens of the whole request
    (a completion may carry several prompts)."""
    body = call.body
    if call.kind == "chat":
        messages = [{"role": str(m.get("role")), "content": _text(m.get("content"))} for m in body["messages"]]
        ids = encode(chat_prompt(messages), vocab_size)
        return ids, len(ids)
    prompt: Any = body.get("prompt")
    if isinstance(prompt, str):
        ids = encode(prompt, vocab_size)
        return ids, len(ids)
    if prompt and isinstance(prompt[0], int):
        return prompt, len(prompt)
    prompts = [encode(p, vocab_size) if isinstance(p, str) else p for p in prompt or ()]
    return (prompts[0] if prompts else []), sum(len(p) for p in prompts)


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def max_tokens(call: LlmCall, prompt_len: int, context: int | None) -> int:
    """The output tokens ``call`` asks for, as the engine will read them."""
    body = call.body
    given = body.get("max_completion_tokens") if call.kind == "chat" else None
    given = given if given is not None else body.get("max_tokens")
    if isinstance(given, int) and given >= 1:
        return given
    if call.kind == "completion":
        return COMPLETION_MAX_TOKENS
    return max(1, (context or UNKNOWN_CONTEXT) - prompt_len)


def token_request(request_id: str, call: LlmCall, ask: LlmAsk, block_size: int = BLOCK_SIZE,
                  vocab_size: int = VOCAB, context: int | None = None) -> TokenRequest:
    """``call`` as its router sees it."""
    ids, n = prompt_ids(call, vocab_size)
    hashes: Sequence[int] = block_hashes(ids, block_size)
    return TokenRequest(request_id, n, max_tokens(call, n, context), hashes, ask.ttft_slo, ask.tpot_slo,
                        ask.band, ask.tenant)
