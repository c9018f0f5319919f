"""``headrace plan``: plan a GPU pool for model deployments, print it, optionally apply it."""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from placement.apply.executors import EXECUTORS, DryRun, ExecutorError, Nvml
from placement.plan import Plan, PlanError
from placement.problem import add_problem_args, load
from placement.solve.solver import SolverError, solve
from placement.spec import SpecError
from profiles.catalogue import CatalogueError
from profiles.profile import ProfileError, ProfileSet

HELP = """Plan MIG layouts, MPS shares and replicas for the models in -f files on the GPU pool
in -f files, from the reference profiles (plus derived ones for unprofiled slices), the
digits family's measured profiles and the profile files the deployments' variants name.

examples:
  headrace plan -f placement/examples/pool.yaml -f placement/examples/models.yaml
  headrace plan -f pool.yaml -f models.yaml --method milp --time-limit 5
  headrace plan -f pool.yaml -f models.yaml --bound        # greedy, and how far from optimal
  headrace plan -f pool.yaml -f models.yaml --objective accuracy --max-gpus 2 --method milp
  headrace plan -f pool.yaml -f models.yaml --mean-accuracy-floor 0.79 --method milp
  headrace plan -f pool.yaml -f models.yaml --apply --executor dry-run
  headrace plan -f placement/examples/emulated-pool.yaml -f placement/examples/emulated-models.yaml \\
      --apply --executor emulated --hold 60
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plan", help="plan GPU placement (MIG/MPS) for model deployments",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_problem_args(p)
    p.add_argument("--objective", choices=("gpus", "cost", "accuracy"), default=None,
                   help="override the GpuPool's objective: the fewest GPUs, the least cost (either drops "
                        "the document's budget), or the most accurate answers within --max-gpus / "
                        "--max-cost-per-hour")
    p.add_argument("--max-gpus", type=int, default=None, metavar="N",
                   help="objective accuracy: GPUs the plan may use (overrides the pool's max_gpus)")
    p.add_argument("--max-cost-per-hour", type=float, default=None, metavar="X",
                   help="objective accuracy: cost per hour the plan may reach (overrides max_cost_per_hour)")
    p.add_argument("--mean-accuracy-floor", type=float, default=None, metavar="F",
                   help="every model's predicted mean accuracy of answers >= F (overrides mean_accuracy_floor)")
    p.add_argument("--bound", action="store_true",
                   help="greedy: also compute the lower bound on GPUs (or cost) and the plan's gap to it, "
                        "seconds more on a large fleet (the MILP always computes it)")
    p.add_argument("--output", choices=("table", "yaml", "both"), default="both")
    p.add_argument("--apply", action="store_true", help="apply the plan with --executor")
    p.add_argument("--executor", choices=EXECUTORS, default="dry-run")
    p.add_argument("--hold", type=float, default=None,
                   help="emulated: serve this many seconds, then stop (default: until Ctrl-C)")
    p.set_defaults(func=run)


def render(plan: Plan, console: Console) -> None:
    inv = plan.inventory
    budget = "".join([f", max {inv.max_gpus} GPUs" if inv.max_gpus is not None else "",
                      f", max ${inv.max_cost_per_hour:g}/h" if inv.max_cost_per_hour is not None else "",
                      f", mean accuracy floor {inv.mean_accuracy_floor:g}" if inv.mean_accuracy_floor is not None else ""])
    # NOTE: escaped: a method such as milp[time-limit] reads as rich markup
    if plan.gap != float("inf"):
        bound = f"lower bound {plan.lower_bound:g}, gap {plan.gap:.1%}"
    else:  # the greedy computes none unless asked; an accuracy plan may have none
        bound = "no bound" + (" (--bound computes it)" if plan.method.startswith("greedy") else "")
    t = Table(title=f"plan ({escape(plan.method)}, objective {inv.objective}{budget}): {plan.gpu_count} GPUs, "
                    f"${plan.cost_per_hour:.2f}/h, {bound}, {plan.solve_seconds:.2f} s")
    for col in ("GPU", "model", "slice", "MPS share", "variant", "max batch", "req/s"):
        t.add_column(col, justify="right" if col in ("MPS share", "max batch", "req/s") else "left")
    for g in plan.used():
        first = True
        for s in g.slices:
            for r in s.replicas:
                t.add_row(g.id if first else "", g.gpu if first else "", s.label,
                          f"{r.share:.0%}" if s.mps else "-", r.variant, str(r.max_batch), f"{r.capacity:.0f}")
                first = False
    console.print(t)
    mean = plan.mean_accuracy()
    m = Table(title="models" + ("" if mean is None else f": mean accuracy {mean:.4f}"))
    for col in ("model", "rate", "SLO ms", "priority", "capacity", "headroom", "mean accuracy", "req/s by variant"):
        m.add_column(col, justify="left" if col in ("model", "priority", "req/s by variant") else "right")
    means, splits, caps = plan.mean_accuracies(), plan.splits(), plan.capacities()
    for d in plan.demands:
        acc = "unknown" if means[d.model] is None else f"{means[d.model]:.4f}"
        split = ", ".join(f"{v} {r:.0f}" for v, r in splits[d.model].items() if r > 0.05) or "-"
        m.add_row(d.model, f"{d.rate:g}", f"{d.slo * 1e3:g}", d.priority,
                  f"{caps[d.model]:.0f}", f"{caps[d.model] / d.rate if d.rate > 0 else float('inf'):.2f}x", acc, split)
    console.print(m)
    if plan.shortfall:
        short = Table(title=f"partial plan: {len(plan.shortfall)} best-effort models placed short (every "
                            "guaranteed model placed whole)")
        for col in ("model", "required req/s", "placed req/s", "unplaced req/s", "more GPUs that would place it"):
            short.add_column(col, justify="left" if col in ("model", "more GPUs that would place it") else "right")
        for sf in plan.shortfall:
            short.add_row(sf.model, f"{sf.required:.0f}", f"{sf.placed:.0f}", f"{sf.unplaced:.0f}",
                          " or ".join(f"{n} x {g}" for g, n in sf.gpus) or "-")
        console.print(short)
    for f in plan.floors:  # NOTE: one line each, as the operator's status prints it
        console.print(f"{'warning' if f.met else 'floor not met'}: {f.describe()}", markup=False, highlight=False)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused for the block, as it was after. Loading and planning
    a fleet allocate millions of objects (YAML nodes, profiles, candidates) and free them by
    reference counting, none of them cyclic garbage; the collector's full passes over the
    growing heap found nothing and took about a sixth of ``headrace plan`` on the 1,000-model
    fleet."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def run(args: argparse.Namespace) -> int:
    err = Console(stderr=True)
    out = Console()

    def fail(msg: object) -> int:
        # NOTE: one line, never a traceback: markup and wrapping would split or mangle it
        err.print(f"headrace plan: {' '.join(str(msg).split())}", style="red", markup=False,
                  highlight=False, soft_wrap=True)
        return 2

    with _collector_paused():
        try:
            inv, demands, profiles = load(args.file, args.profiles, args)
            plan = solve(demands, profiles, inv, args.method, time_limit=args.time_limit,
                         bound=args.method != "greedy" or args.bound)
            plan.verify()
        except (SpecError, SolverError, ProfileError, PlanError, CatalogueError) as e:
            return fail(e)
        except Exception as e:  # noqa: BLE001  (bad input must not end in a traceback)
            return fail(f"unexpected {type(e).__name__}: {e}")
        if args.output in ("table", "both"):
            render(plan, out)
        if args.output in ("yaml", "both"):
            # libyaml's emitter where PyYAML has it: a fleet's plan is megabytes of YAML
            dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
            sys.stdout.write(yaml.dump(plan.to_dict(), Dumper=dumper, sort_keys=False))
    if not args.apply:
        return 0
    try:
        return _apply(plan, profiles, args, out)
    except ExecutorError as e:
        err.print(f"[red]headrace plan --apply: {e}[/red]", highlight=False)
        return 1


def _apply(plan: Plan, profiles: ProfileSet, args: argparse.Namespace, out: Console) -> int:
    if args.executor == "dry-run":
        dry = DryRun()
        dry.apply(plan)
        out.print("# commands (dry run)")
        sys.stdout.write(dry.script())
        return 0
    if args.executor == "nvml":
        uuids = Nvml().apply(plan)
        for (gpu, sl), uuid in uuids.items():
            out.print(f"{gpu} {sl} {uuid}")
        return 0
    from placement.apply.emulated import Emulated  # noqa: PLC0415  (starts processes; import on demand)

    with Emulated(profiles) as ex:
        for e in ex.apply(plan):
            out.print(f"{e.replica_id}: {e.variant} http://{e.http_url} grpc://{e.grpc_url} "
                      f"(share {e.share:.0%}, max batch {e.max_batch}, {e.capacity:.0f} req/s)")
        out.print("serving; Ctrl-C to stop" if args.hold is None else f"serving for {args.hold:g} s")
        try:
            time.sleep(args.hold if args.hold is not None else 10**9)
        except KeyboardInterrupt:
            pass
    return 0
