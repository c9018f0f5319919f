"""``headrace engine``: serve an LLM profile as an emulated engine behind vLLM's OpenAI API, with
vLLM's flag names for the scheduler and the KV cache."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from profiles.llm.profile import find_llm_profile
from profiles.profile import ProfileError


class _Refusal(Exception):
    """Bad input: one line, exit 2."""


def _build(args: argparse.Namespace):  # noqa: ANN202
    from profiles.emulator.llm_server import EmulatedEngine, make_app
    from profiles.llm.engine import Engine

    profile = find_llm_profile(args.profile)
    if not 0 < args.gpu_memory_utilization <= 1:
        raise _Refusal(f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization}")
    settings: dict[str, object] = {"prefix_caching": args.enable_prefix_caching,
                                   "chunked_prefill": args.enable_chunked_prefill}
    for flag, key in (("max_num_seqs", "max_num_seqs"), ("max_num_batched_tokens", "max_num_batched_tokens"),
                      ("block_size", "block_size")):
        value = getattr(args, flag)
        if value is not None:
            if value < 1:
                raise _Refusal(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
            settings[key] = value
    if args.max_model_len is not None:
        if not 1 <= args.max_model_len <= profile.max_model_len:
            raise _Refusal(f"--max-model-len ({args.max_model_len}) must be between 1 and {profile.name}'s "
                           f"context ({profile.max_model_len})")
        settings["max_model_len"] = args.max_model_len
    config = profile.engine_config(args.gpu_memory_utilization, **settings)
    names = args.served_model_name or [profile.variant]
    engine = EmulatedEngine(Engine(config, profile.step_time), names[0], frontend_s=profile.frontend_s)
    return profile, config, names, make_app(engine, names, args.enable_prompt_tokens_details)


async def _serve(args: argparse.Namespace) -> int:
    from profiles.emulator.llm_server import serve

    profile, config, names, app = _build(args)
    try:
        runner, port = await serve(app, args.host, args.port)
    except OSError as e:
        raise _Refusal(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"emulated engine {profile.name} serving {', '.join(names)} on http://{args.host}:{port}/v1 "
          f"(KV blocks {config.num_blocks} of {config.block_size} tokens, max_model_len {config.max_model_len}, "
          f"max_num_seqs {config.max_num_seqs}, max_num_batched_tokens {config.max_num_batched_tokens})",
          flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_serve(args))
    except (_Refusal, ProfileError, ValueError) as e:
        print(f"headrace engine: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "engine", help="serve an LLM profile as an emulated engine (OpenAI API, vLLM metrics, KV events)",
        description="Run the LLM engine model of a profile in real time behind vLLM's OpenAI API: "
                    "/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics, /v1/kv_events.")
    p.add_argument("--profile", required=True,
                   help="an LlmProfile YAML file, or a reference profile's name (variant@gpu/slice) or variant")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free one, printed)")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="model names the server answers for (default: the profile's variant)")
    p.add_argument("--max-num-seqs", type=int, default=None, help="requests running at once (default 256)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="token budget per step (default 8192)")
    p.add_argument("--max-model-len", type=int, default=None, help="context length (default: the profile's)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="share of device memory for weights, activations and KV cache (default 0.9)")
    p.add_argument("--block-size", type=int, default=None, help="tokens per KV block (default 16)")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="the prefix cache (default on)")
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True,
                   help="chunked prefill (default on)")
    p.add_argument("--enable-prompt-tokens-details", action="store_true",
                   help="usage reports the prompt tokens found in the prefix cache (prompt_tokens_details."
                        "cached_tokens; default off: null, as vLLM)")
    p.set_defaults(func=run)
