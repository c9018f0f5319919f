"""``headrace demo``: the whole product on this machine, end to end, through ``headrace up``.

1. up: the quickstart documents (``deploy/examples/quickstart``: an emulated A100-80GB with MIG
   and the host; ResNet-50 replaying its reference profile, and the real "digits" MLP family,
   trained here on scikit-learn's bundled data set) are validated, planned and applied by the
   operator, detached: one real Triton server per planned replica, the gateway configured from
   the plan;
2. load: ``headrace load``'s engine drives the gateway open-loop for each deployment and prints
   the report (the digits variants' held-out accuracy beside it);
3. status, then down. Every process is stopped, also on failure or Ctrl-C: ``headrace down``,
   and if that fails the controller's own process id, then what it recorded.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import yaml
from rich.console import Console

QUICKSTART = Path(__file__).resolve().parent / "examples" / "quickstart"


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
    """(model, rate, SLO ms) of each deployment in the files."""
    from profiles.schema import load_documents

    return [(d.spec.model, override if override is not None else d.spec.rate, d.spec.slo_ms)
            for d in load_documents(*files).deployments]


def _with_rate(files: list[str], rate: float, workdir: Path) -> list[str]:
    """Copies of the documents with every deployment's rate set to ``rate``."""
    from deploy.operator.documents import resolved_stream

    docs = list(yaml.safe_load_all(resolved_stream(files)))
    for d in docs:
        if d.get("kind") == "ModelDeployment":
            d["spec"]["rate"] = rate
    path = workdir / "documents.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return [str(path)]


def run(args: argparse.Namespace) -> int:
    from deploy.operator.cli import ensure_down, main
    from profiles.digits.family import MEASURED_DIR
    from profiles.profile import ProfileSet

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
    p.add_argument("--rate", type=float, default=None, help="override every deployment's request rate")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds of load per deployment")
    p.add_argument("--arrival", choices=("poisson", "gamma", "constant"), default="poisson")
    p.add_argument("--cv", type=float, default=1.0, help="gamma coefficient of variation")
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    p.add_argument("--seed", type=int, default=0)

    def _run(args: argparse.Namespace) -> int:
        if not args.file:
            args.file = [str(QUICKSTART)]
        return run(args)

    p.set_defaults(func=_run)
