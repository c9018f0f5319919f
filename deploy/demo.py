"""``headrace demo``: the whole product on this machine, end to end, in about a minute.

1. plan: the example pool (one emulated A100-80GB) and demand (ResNet-50, rate, SLO) go
   through the placement solver; the plan is verified and printed;
2. apply: the emulated executor starts one arbiter per planned GPU and one real Triton
   server per replica, each serving an emulated model that replays its slice's profile;
3. serve: ``headrace serve`` runs as its own process in front of those Triton servers;
4. load: ``headrace load``'s engine drives the gateway open-loop and prints the report;
5. real models: the digits MLP family (trained here on scikit-learn's bundled data set, held-out
   accuracy measured) served by real Triton behind the gateway as one model with three
   variants; the gateway picks the most accurate variant predicted to meet each deadline.
Every process started here is stopped by PID / process group, also on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import yaml
from rich.console import Console

from profiles.process import start_serve, stop_group
from profiles.tritonserver import free_port

EXAMPLES = Path(__file__).resolve().parent.parent / "placement" / "examples"
DIGITS_RATE = 200.0  # req/s offered to the digits model
DIGITS_SLO = 0.05  # seconds


class DemoError(RuntimeError):
    pass


@contextlib.contextmanager
def serving(cfg: dict, workdir: Path) -> Iterator[tuple[str, str]]:
    """``headrace serve`` on ``cfg`` as its own process group; yields (http, grpc) addresses."""
    cfg_path = workdir / f"gateway-{len(list(workdir.glob('gateway-*.yaml')))}.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    http = f"127.0.0.1:{cfg['listen']['http_port']}"
    try:
        proc = start_serve(cfg_path, http, cfg_path.with_suffix(".log"))
    except RuntimeError as e:
        raise DemoError(str(e)) from None
    try:
        yield http, f"127.0.0.1:{cfg['listen']['grpc_port']}"
    finally:
        stop_group(proc)


def _load(out: Console, args: argparse.Namespace, target: str, model: str, rate: float, slo: float,
          duration: float) -> None:
    from loadgen.report import print_report
    from loadgen.run import run_load_sync
    from loadgen.spec import LoadSpec

    spec = LoadSpec(target=target, model=model, arrival=args.arrival, cv=args.cv, rate=rate,
                    duration_s=duration, warmup_s=1.0, slo_ms=slo * 1e3, seed=args.seed)
    print_report(run_load_sync(spec).summary, out)


def _digits(out: Console, args: argparse.Namespace, workdir: Path) -> None:
    from profiles.digits import MEASURED_DIR, write_digits_models
    from profiles.tritonserver import TritonServer

    repo = workdir / "digits-repo"
    accuracy = write_digits_models(repo)
    out.print("held-out accuracy: " + ", ".join(f"{v} {a:.1%}" for v, a in accuracy.items()))
    with TritonServer(repo) as triton:
        cfg = {
            "listen": {"host": "127.0.0.1", "http_port": free_port(), "grpc_port": free_port()},
            "models": [{
                "name": "digits", "slo_ms": DIGITS_SLO * 1e3, "max_batch": 64,
                "replicas": [{"url": triton.http_url, "variant": v, "profile": str(MEASURED_DIR / f"{v}.yaml")}
                             for v in accuracy],
            }],
        }
        with serving(cfg, workdir) as (http, grpc):
            out.print(f"gateway: model 'digits' = variants {', '.join(accuracy)} on Triton {triton.http_url}")
            _load(out, args, f"{args.protocol}://{grpc if args.protocol == 'grpc' else http}", "digits",
                  DIGITS_RATE, DIGITS_SLO, min(args.duration, 5.0))


def run(args: argparse.Namespace) -> int:
    from placement.cli import load_profile_set, render
    from placement.emulated import Emulated
    from placement.render import gateway_config
    from placement.solver import solve
    from placement.spec import load_problem

    out = Console(width=max(Console().width, 120))
    inventory, demands, _ = load_problem(*args.file)
    if args.rate is not None:
        from dataclasses import replace

        demands = [replace(d, rate=args.rate) for d in demands]
    profiles = load_profile_set([])
    plan = solve(demands, profiles, inventory, "greedy")
    plan.verify()
    out.rule("[bold]1. plan")
    render(plan, out)

    workdir = Path(tempfile.mkdtemp(prefix="headrace-demo-"))
    try:
        with Emulated(profiles) as ex:
            out.rule("[bold]2. apply (emulated GPUs, real Triton)")
            for e in ex.apply(plan):
                out.print(f"{e.replica_id}: Triton grpc://{e.grpc_url} serving {e.variant} "
                          f"(planned {e.capacity:.0f} req/s)")
            out.rule("[bold]3. serve (headrace gateway)")
            cfg = gateway_config(plan, ex.endpoints.values(), profiles, workdir / "profiles",
                                 {"listen": {"host": "127.0.0.1", "http_port": free_port(), "grpc_port": free_port()}})
            with serving(cfg, workdir) as (http, grpc):
                out.print(f"gateway ready: http {http}  grpc {grpc}")
                for d in plan.demands:
                    out.rule(f"[bold]4. load: {d.model}, {args.arrival} {d.rate:g} req/s, SLO {d.slo * 1e3:g} ms, "
                             f"{args.duration:g} s")
                    _load(out, args, f"{args.protocol}://{grpc if args.protocol == 'grpc' else http}",
                          d.model, d.rate, d.slo, args.duration)
        if not args.no_digits:
            out.rule("[bold]5. real models: the digits family, one model, three variants")
            _digits(out, args, workdir)
    except DemoError as e:
        out.print(f"[red]headrace demo: {e}[/red]", highlight=False)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="plan, start emulated GPUs + Triton + the gateway, run a short load test, report",
        description="The main job on the embedded default: plan the example pool and demand, apply "
        "it on emulated GPUs with real Triton servers, serve it through the gateway and load-test it.",
    )
    p.add_argument("-f", "--file", action="append",
                   default=None, help="pool/model YAMLs (default: placement/examples/emulated-*.yaml)")
    p.add_argument("--rate", type=float, default=None, help="override every model's request rate")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds of load")
    p.add_argument("--arrival", choices=("poisson", "gamma", "constant"), default="poisson")
    p.add_argument("--cv", type=float, default=1.0, help="gamma coefficient of variation")
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-digits", action="store_true", help="skip the real-model (digits) phase")

    def _run(args: argparse.Namespace) -> int:
        if not args.file:
            args.file = [str(EXAMPLES / "emulated-pool.yaml"), str(EXAMPLES / "emulated-models.yaml")]
        return run(args)

    p.set_defaults(func=_run)
