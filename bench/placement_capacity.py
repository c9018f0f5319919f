"""Does a plan's predicted capacity hold when served? Apply small plans on emulated GPUs, put
the gateway in front, offer Poisson load at the predicted capacity and measure goodput
(requests answered within the SLO per second). Target: goodput within 10% of the prediction.

Scenarios: ResNet-50 alone on an A100-80GB 1g.10gb slice (SLO 100 ms), and two ResNet-50 MPS
clients at 50% each sharing a 2g.20gb slice. The single-replica scenario is also measured
straight against Triton's own dynamic batcher (no gateway), as a reference.

    .venv/bin/python -m bench.placement_capacity [--duration 20]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

from bench.output import write_results
from placement.plan import Demand, GpuClass, GpuPlan, Inventory, Plan, Replica, SlicePlan
from placement.solve.capacity import replica_capacity
from profiles.derive import with_derived
from profiles.profile import ProfileSet
from profiles.triton.process import exit_on_sigterm

OUT = Path(__file__).parent / "results"
SLO = 0.100


def scenario_plans(ps: ProfileSet) -> dict[str, Plan]:
    inv = Inventory((GpuClass("A100-80GB", ("local/gpu0",), 1.0, True, True),))

    def rep(slice_: str, share: float) -> Replica:
        cap = replica_capacity(ps.get("resnet50", "A100-80GB", slice_), SLO, share)
        return Replica("resnet50", "resnet50", share, cap.max_batch, cap.rate)

    plans = {}
    for name, sl in {
        "1g.10gb exclusive": SlicePlan("1g.10gb", 0, False, (rep("1g.10gb", 1.0),)),
        "2g.20gb, 2 MPS clients at 50%": SlicePlan("2g.20gb", 0, True, (rep("2g.20gb", .5), rep("2g.20gb", .5))),
    }.items():
        cap = sum(r.capacity for r in sl.replicas)
        demand = Demand("resnet50", cap, SLO)
        plans[name] = Plan((GpuPlan("local/gpu0", "A100-80GB", True, (sl,)),), (demand,), inv, "hand", 0, 0, ps)
    return plans


def measure(plan: Plan, ps: ProfileSet, duration: float, seed: int = 0, fraction: float = 1.0,
            via: str = "gateway") -> dict:
    """Serve ``plan`` and offer ``fraction`` x its predicted capacity for ``duration`` seconds,
    through the gateway or (one replica only) straight to Triton's own dynamic batcher."""
    import yaml

    from bench.gateway_overhead import start_gateway
    from loadgen.run import run_load_sync
    from loadgen.spec import LoadSpec
    from placement.apply.emulated import Emulated
    from placement.apply.render import gateway_config
    from profiles.schema import GatewaySettings, ListenConfig
    from profiles.triton.process import stop_group
    from profiles.triton.server import free_port

    plan.verify()
    predicted = plan.capacity("resnet50")
    with Emulated(ps, triton_batching=via == "triton") as ex:  # Triton batches only when it is the batcher
        endpoints = ex.apply(plan)
        if via == "triton":
            res = run_load_sync(LoadSpec(target=f"grpc://{endpoints[0].grpc_url}", model="resnet50",
                                         rate=predicted * fraction, duration_s=duration, warmup_s=3.0,
                                         slo_ms=SLO * 1e3, seed=seed))
            return _row(res.summary, predicted, fraction)
        hp, gp = free_port(), free_port()
        cfg_path = ex.workdir / "gateway.yaml"
        listen = GatewaySettings(listen=ListenConfig(host="127.0.0.1", http_port=hp, grpc_port=gp))
        cfg = gateway_config(plan, ex.endpoints.values(), ex.profiles, ex.workdir / "profiles", listen)
        cfg_path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_unset=True)))
        gw = start_gateway(cfg_path, hp, None)  # its own process: the load generator keeps its GIL
        try:
            res = run_load_sync(LoadSpec(target=f"grpc://127.0.0.1:{gp}", model="resnet50", rate=predicted * fraction,
                                         duration_s=duration, warmup_s=3.0, slo_ms=SLO * 1e3, seed=seed))
        finally:
            stop_group(gw)
    return _row(res.summary, predicted, fraction)


def _row(s: dict, predicted: float, fraction: float) -> dict:
    return {"fraction": fraction, "predicted_rps": round(predicted, 1),
            "offered_rps": round(s.get("offered_rps", predicted * fraction), 1),
            "goodput_rps": round(s["goodput_rps"], 1), "attainment": s["attainment"],
            "p99_ms": s["latency_ms"]["p99"], "goodput_vs_predicted": round(s["goodput_rps"] / predicted, 4),
            "fell_behind": bool(s.get("fell_behind")),
            "load_average": round(os.getloadavg()[0], 2), "pass": s["goodput_rps"] >= 0.9 * predicted * fraction}


def markdown(result: dict) -> str:
    meta, rows = result["meta"], result["rows"]
    lines = ["# Predicted capacity vs served goodput (emulated GPUs, gateway, Poisson load)", "",
             f"`{meta['command']}` on {meta['machine']}. Poisson load offered at a fraction of the "
             "predicted capacity; SLO 100 ms. `load avg` is the machine's 1-minute load average after the "
             "run (2 cores): above 2 the client, gateway and Triton were starved of CPU and the row says "
             "little about the plan.", "",
             "| scenario @ offered | predicted req/s | offered req/s | goodput req/s | attainment | p99 ms | "
             "client fell behind | load avg | goodput >= 0.9 x offered |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['predicted_rps']} | {r['offered_rps']} | {r['goodput_rps']} | "
                     f"{r['attainment']:.4f} | {r['p99_ms']:.1f} | {r['fell_behind']} | {r['load_average']} | "
                     f"{r['pass']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--fractions", default="0.5,0.9,1.0", help="offered load / predicted capacity")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    exit_on_sigterm()  # what it started is stopped on the way out
    ps = with_derived(ProfileSet.reference())
    rows = {}
    for name, plan in scenario_plans(ps).items():
        for via in ("gateway", "triton") if len(plan.replicas()) == 1 else ("gateway",):
            for f in (float(x) for x in args.fractions.split(",")):
                key = f"{name} via {via} @ {f:g}x"
                rows[key] = measure(plan, ps, args.duration, fraction=f, via=via)
                print(key, json.dumps(rows[key]), flush=True)
    meta = {"command": f"python -m bench.placement_capacity --duration {args.duration:g} --fractions {args.fractions}",
            "machine": f"{platform.machine()} {platform.python_version()}"}
    result = {"meta": meta, "rows": rows}
    write_results(args.out, "placement_capacity", result, markdown(result))
    print(markdown(result))
    return 0 if all(r["pass"] for r in rows.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
