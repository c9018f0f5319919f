"""``headrace demo``: the whole product on this machine, end to end, through ``headrace up``.

1. up: the quickstart documents (``deploy/examples/quickstart``: an emulated A100-80GB with MIG,
   an emulated H100-80GB and the host; ResNet-50 replaying its reference profile, the real
   "digits" MLP family, trained here on scikit-learn's bundled data set, and Llama-3.1-8B fp8 on
   an emulated engine) are validated, planned and applied by the operator, detached: one real
   Triton server per planned replica, one engine per LLM replica, the gateway configured from
   the plan;
2. load: ``headrace load``'s engine drives the gateway open-loop for each classic deployment and
   prints the report (the digits variants' held-out accuracy beside it); then the official
   ``openai`` client streams chat completions from each LLM deployment through the gateway, and
   the TTFT and TPOT percentiles and SLO attainment are printed;
3. status, then down. Every process is stopped, also on failure or Ctrl-C: ``headrace down``,
   and if that fails the controller's own process id, then what it recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

QUICKSTART = Path(__file__).resolve().parent / "examples" / "quickstart"
LLM_REQUESTS = 20
PROMPT = "Explain in a few sentences why a request has a deadline and how a batch is formed. " * 4


class DemoError(RuntimeError):
    pass


def _load(out: Console, args: argparse.Namespace, target: str, model: str, rate: float, slo_ms: float,
          duration: float) -> None:
    from loadgen.report import print_report
    from loadgen.run import run_load_sync
    from loadgen.spec import LoadSpec

    spec = LoadSpec(target=target, model=model, arrival=args.arrival, cv=args.cv, rate=rate,
                    duration_s=duration, warmup_s=1.0, slo_ms=slo_ms, seed=args.seed)
    print_report(run_load_sync(spec).summary, out)


def _rates(files: list[str], override: float | None) -> list[tuple[str, float, float]]:
    """(model, rate, SLO ms) of each classic deployment in the files."""
    from profiles.schema import load_documents

    return [(d.spec.model, override if override is not None else d.spec.rate, d.spec.slo_ms)
            for d in load_documents(*files).deployments if d.spec.llm is None]


async def _stream_llm(http: str, model: str, rate: float, max_tokens: int, seed: int) -> list[tuple[float, float]]:
    """:data:`LLM_REQUESTS` streaming chat completions through the gateway with the ``openai``
    client, sent at Poisson times at ``rate``; each one's (TTFT, TPOT) in seconds (TPOT nan for
    a single token), timed from its scheduled send."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://{http}/v1", api_key="demo", max_retries=0)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, LLM_REQUESTS)
    t0 = time.monotonic()

    async def one(at: float) -> tuple[float, float]:
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        sent, times = t0 + at, []
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens, stream=True)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                times.append(time.monotonic())
        if not times:
            raise DemoError(f"{model}: a stream ended without a token")
        tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else float("nan")
        return times[0] - sent, tpot

    try:
        return list(await asyncio.gather(*(one(at) for at in np.cumsum(gaps))))
    finally:
        await client.close()


def _llm_load(out: Console, http: str, md, seed: int) -> None:  # noqa: ANN001  (a ModelDeployment)
    """Stream from one LLM deployment and print TTFT/TPOT p50 and p90 and the SLO attainment."""
    s = md.spec
    ttft_slo, tpot_slo = s.slo_ms / 1e3, s.llm.slo_tpot_ms / 1e3
    max_tokens = max(2, int(s.llm.output_tokens.mean))
    out.rule(f"[bold]2. stream: {s.model}, {LLM_REQUESTS} chat completions (openai client), Poisson {s.rate:g} "
             f"req/s, {max_tokens} tokens each, SLO TTFT {s.slo_ms:g} ms / TPOT {s.llm.slo_tpot_ms:g} ms")
    try:
        res = asyncio.run(_stream_llm(http, s.model, s.rate, max_tokens, seed))
    except ImportError:
        raise DemoError("the LLM part needs the openai client (pip install 'headrace[openai]')") from None
    except Exception as e:  # noqa: BLE001  (the client's errors: one line, the demo goes on to down)
        raise DemoError(f"{s.model}: streaming through the gateway failed: {e}") from None
    ttft = np.array([t for t, _ in res])
    tpot = np.array([t for _, t in res])
    ok_ttft, ok_tpot = ttft <= ttft_slo, np.isnan(tpot) | (tpot <= tpot_slo)
    t = Table(title=f"{s.model}: {len(res)} streams through the gateway")
    for col in ("", "p50 ms", "p90 ms", "SLO ms", "within SLO"):
        t.add_column(col, justify="right")
    for name, v, slo, ok in (("TTFT", ttft, ttft_slo, ok_ttft), ("TPOT", tpot[~np.isnan(tpot)], tpot_slo, ok_tpot)):
        t.add_row(name, f"{np.percentile(v, 50) * 1e3:.1f}", f"{np.percentile(v, 90) * 1e3:.1f}", f"{slo * 1e3:g}",
                  f"{ok.mean():.0%}")
    out.print(t)
    out.print(f"attainment (both SLOs): {(ok_ttft & ok_tpot).mean():.0%} of {len(res)} requests", highlight=False)


def _with_rate(files: list[str], rate: float, workdir: Path) -> list[str]:
    """Copies of the documents with every classic deployment's rate set to ``rate``."""
    from deploy.operator.documents import resolved_stream

    docs = list(yaml.safe_load_all(resolved_stream(files)))
    for d in docs:
        if d.get("kind") == "ModelDeployment" and "llm" not in d["spec"]:
            d["spec"]["rate"] = rate
    path = workdir / "documents.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return [str(path)]


def run(args: argparse.Namespace) -> int:
    from deploy.operator.cli import ensure_down, main
    from profiles.digits.family import MEASURED_DIR
    from profiles.profile import ProfileSet
    from profiles.schema import load_documents

    out = Console(width=max(Console().width, 120))
    workdir = Path(tempfile.mkdtemp(prefix="headrace-demo-"))
    state = workdir / "state"
    files = args.file
    if args.rate is not None:
        files = _with_rate(files, args.rate, workdir)
    try:
        out.rule("[bold]1. headrace up (plan, emulated GPUs + the host, real Triton, the gateway)")
        if main(["up", "--detach", "--state-dir", str(state), "--timeout", "300", *sum((["-f", f] for f in files), [])]):
            raise DemoError("headrace up failed (see above)")
        st = yaml.safe_load((state / "state.json").read_text())
        http, grpc = st["gateway"]["http"], st["gateway"]["grpc"]
        accuracy = {p.variant: p.accuracy for p in ProfileSet.load(MEASURED_DIR)}
        for model, rate, slo_ms in _rates(files, None):
            out.rule(f"[bold]2. load: {model}, {args.arrival} {rate:g} req/s, SLO {slo_ms:g} ms, "
                     f"{args.duration:g} s")
            if model == "digits":
                out.print("held-out accuracy: " + ", ".join(f"{v} {a:.1%}" for v, a in accuracy.items()))
            _load(out, args, f"{args.protocol}://{grpc if args.protocol == 'grpc' else http}", model, rate,
                  slo_ms, args.duration)
        for md in load_documents(*files).deployments:
            if md.spec.llm is not None:
                _llm_load(out, http, md, args.seed)
        out.rule("[bold]3. headrace status")
        main(["status", "--state-dir", str(state)])
    except DemoError as e:
        out.print(f"[red]headrace demo: {e}[/red]", highlight=False)
        return 1
    finally:
        out.rule("[bold]headrace down")
        ensure_down(state)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="headrace up on the quickstart (emulated GPU + real models), a short load test, status, down",
        description="The main job on the embedded default: bring up the quickstart documents with the "
        "operator (emulated GPUs, real Triton servers, the gateway), load-test every deployment, print "
        "the reports and the status, and stop everything.",
    )
    p.add_argument("-f", "--file", action="append", default=None,
                   help="documents (default: deploy/examples/quickstart)")
    p.add_argument("--rate", type=float, default=None, help="override every classic deployment's request rate")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds of load per classic deployment")
    p.add_argument("--arrival", choices=("poisson", "gamma", "constant"), default="poisson")
    p.add_argument("--cv", type=float, default=1.0, help="gamma coefficient of variation")
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    p.add_argument("--seed", type=int, default=0)

    def _run(args: argparse.Namespace) -> int:
        if not args.file:
            args.file = [str(QUICKSTART)]
        return run(args)

    p.set_defaults(func=_run)
