"""A live re-plan under load against the same load with no change, in the same run.

``headrace up`` brings a fleet up on each pool: the quickstart's (one emulated A100-80GB and
the host, no GPU to spare) and one with a second A100. It serves ResNet-50 on the emulated
GPUs, the real digits family on the host, and a user's python-backend model
(``deploy/examples/versioned``) at a pinned version. Each round offers open-loop Poisson load
at ~70% of the planned capacity three times, through ``headrace load``'s engine: once with no
change; once while ``headrace apply`` doubles ResNet-50's rate (capacity is added) and rolls the
user model out at its other version, swaps the serving digits variant for another, and then
puts the rate back (each apply make-before-break); and once while the controller is killed
(SIGKILL) and its supervisor starts it again, which takes the fleet over: the seconds until it
answers again, and whether every process kept its pid, are recorded. Beside it, a plain ``tritonclient`` HTTP client
sends one request at a time, as a user's client would, and counts what fails. Reported per
run: attainment, refused and late shares, p99, errors and unanswered requests; the change
runs' window is the whole run (every apply, and the crash, happens inside it). Target:
attainment within 1 point of the no-change run, no error (no 503); after a crash, the
controller back within 10 s with every process adopted.

    .venv/bin/python -m bench.replan [--rounds 3] [--duration 30] [--pools quickstart,two]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.host import cpu_times, steal_share
from bench.output import git_commit, write_results
from profiles.triton.process import exit_on_sigterm

OUT = Path(__file__).parent / "results"
DIGITS = ["digits-small", "digits-medium", "digits-large"]


VERSIONED = Path(__file__).resolve().parents[1] / "deploy/examples/versioned"
POOLS = {"quickstart": 1, "two": 2}  # emulated A100s beside the host


def documents(a100s: int, resnet_rate: float, digits_variants: list[str], version: int) -> list[dict[str, Any]]:
    meta = {"apiVersion": "headrace.dev/v1"}
    scaler = {"name": "scaler-v1", "artifact": {"uri": str(VERSIONED / "models/scaler"), "version": version},
              "profile": str(VERSIONED / "profiles/scaler-v1.yaml")}
    return [
        {**meta, "kind": "GpuPool", "metadata": {"name": "bench"}, "spec": {"emulate": True, "nodes": [
            {"name": "local", "gpus": [{"model": "A100-80GB", "count": a100s}, {"model": "cpu", "count": 1}]}]}},
        {**meta, "kind": "ModelDeployment", "metadata": {"name": "resnet50"},
         "spec": {"model": "resnet50", "rate": resnet_rate, "slo_ms": 100}},
        {**meta, "kind": "ModelDeployment", "metadata": {"name": "digits"},
         "spec": {"model": "digits", "source": "digits", "rate": 100, "slo_ms": 50, "variants": digits_variants,
                  "accuracy_floor": 0.97}},
        {**meta, "kind": "ModelDeployment", "metadata": {"name": "scaler"},
         "spec": {"model": "scaler", "source": "artifact", "rate": 50, "slo_ms": 100, "variants": [scaler]}},
        {**meta, "kind": "Gateway", "metadata": {"name": "gw"},
         "spec": {"listen": {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0}}},
    ]


def digits_serving(status: dict[str, Any]) -> str:
    return next(d for d in status["deployments"] if d["name"] == "digits")["replicas"][0]["variant"]


def write(path: Path, docs: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


class TritonClientProbe(threading.Thread):
    """A user's client: tritonclient.http, one request at a time, every failure counted."""

    def __init__(self, url: str, model: str, period: float, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.url, self.model, self.period, self.stop = url, model, period, stop
        self.sent = self.ok = self.refused = 0
        self.failures: list[str] = []

    def run(self) -> None:
        import tritonclient.http as th  # noqa: PLC0415
        from tritonclient.utils import InferenceServerException  # noqa: PLC0415

        client = th.InferenceServerClient(self.url)
        meta = client.get_model_metadata(self.model)
        inp = meta["inputs"][0]
        shape = [1] + [int(d) for d in inp["shape"][1:]]
        x = th.InferInput(inp["name"], shape, inp["datatype"])
        x.set_data_from_numpy(np.zeros(shape, dtype=np.float32))
        while not self.stop.is_set():
            self.sent += 1
            try:
                client.infer(self.model, [x])
                self.ok += 1
            except InferenceServerException as e:
                if "429" in str(e.status()) or "infeasible" in str(e) or "expired" in str(e):
                    self.refused += 1
                else:
                    self.failures.append(str(e)[:200])
            time.sleep(self.period)
        client.close()


def crash(state: Path) -> dict[str, Any]:
    """SIGKILL to the controller; the seconds until its successor answers, and whether it
    adopted every process (same pids) at the same generation."""
    import signal  # noqa: PLC0415

    from deploy.operator.client import CliError, call  # noqa: PLC0415
    from deploy.operator.state import DirStateStore, same_process  # noqa: PLC0415

    store = DirStateStore(state)
    st = store.read()
    pids = {k: v["pid"] for k, v in st["processes"].items()}
    t0 = time.monotonic()
    os.kill(st["controller_pid"], signal.SIGKILL)
    while time.monotonic() - t0 < 60:
        now = store.read()
        if now.get("running") and now.get("controller_pid") != st["controller_pid"] and same_process(
                now["controller_pid"], now.get("controller_started")):
            try:
                status = call(now["admin_url"], store.token(), "GET", "/v1/status")
            except CliError:
                status = None
            if status is not None and any(e["kind"] == "Adopted" for e in status["events"]):
                return {"back_s": round(time.monotonic() - t0, 2), "adopted": {k: v["pid"] for k, v in
                                                                                now["processes"].items()} == pids,
                        "generation_kept": status["generation"] == st["generation"]}
        time.sleep(0.1)
    return {"back_s": None, "adopted": False, "generation_kept": False}


def one_run(op: dict[str, str], mix: str, rate: float, duration: float, seed: int,
            changes: list[Path] | None, tmp: Path, kill: Path | None = None) -> dict[str, Any]:
    """One run of the load; ``changes``: apply them inside it; ``kill``: the state directory
    whose controller is killed inside it."""
    from deploy.operator.client import call  # noqa: PLC0415
    from loadgen.run import run_load_sync  # noqa: PLC0415
    from loadgen.spec import LoadSpec  # noqa: PLC0415

    spec = LoadSpec(target=f"http://{op['http']}", mix=mix, rate=rate, duration_s=duration, warmup_s=0.5,
                    slo_ms=100, seed=seed)
    stop = threading.Event()
    probe = TritonClientProbe(op["http"], "resnet50", 0.05, stop)
    applies: list[dict[str, Any]] = []

    crashed: dict[str, Any] = {}

    def change() -> None:
        time.sleep(2.0)
        if kill is not None:
            crashed.update(crash(kill))
        for path in changes or []:
            t0 = time.monotonic()
            res = call(op["admin"], op["token"], "POST", "/v1/apply", path.read_bytes())
            applies.append({"file": path.name, "seconds": round(time.monotonic() - t0, 2), "steps": len(res["steps"]),
                            "started": res["started"], "stopped": res["stopped"]})
            time.sleep(1.0)

    changer = threading.Thread(target=change, daemon=True)
    t_cpu = cpu_times()
    probe.start()
    changer.start()
    s = run_load_sync(spec).summary
    stop.set()
    changer.join(300)
    probe.join(30)
    unanswered = s["offered"] - s["ok"] - s["rejected"] - s["error_count"] - s["expired"]
    return {
        "change": "crash" if kill is not None else bool(changes), "seed": seed, "crash": crashed or None, "offered": s["offered"], "attainment": s["attainment"],
        "refused": s["rejected"] / s["offered"], "late": (s["ok"] - s["good"]) / s["offered"],
        "p99_ms": s["latency_ms"]["p99"], "errors": s["error_count"], "expired": s["expired"],
        "unanswered": unanswered, "applies": applies, "applies_done_in_window": len(applies) == len(changes or []),
        "tritonclient": {"sent": probe.sent, "ok": probe.ok, "refused": probe.refused, "failed": len(probe.failures),
                         "failures": probe.failures[:5]},
        "steal": steal_share(t_cpu, cpu_times()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--load", type=float, default=0.7, help="offered load / planned capacity")
    ap.add_argument("--pools", default="quickstart,two", help=f"comma-separated, of {sorted(POOLS)}")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    pools = a.pools.split(",")
    if any(p not in POOLS for p in pools):
        ap.error(f"--pools: each of {sorted(POOLS)} (got {a.pools!r})")
    exit_on_sigterm()
    result = {"benchmark": "replan", "commit": git_commit(), "rounds": a.rounds, "duration_s": a.duration,
              "load": a.load, "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "pools": {p: one_pool(p, a) for p in pools}}
    write_results(a.out, "replan", result, render(result))
    print(render(result))
    return 0


def one_pool(name: str, a: argparse.Namespace) -> dict[str, Any]:
    from deploy.cli import main as headrace  # noqa: PLC0415
    from deploy.operator.cli import ensure_down  # noqa: PLC0415
    from deploy.operator.client import call  # noqa: PLC0415
    from deploy.operator.state import DirStateStore  # noqa: PLC0415

    tmp = Path(tempfile.mkdtemp(prefix="headrace-bench-replan-"))
    state = tmp / "state"
    runs: list[dict[str, Any]] = []
    a100s, version = POOLS[name], 1
    try:
        base = write(tmp / "base.yaml", documents(a100s, 200, DIGITS, version))
        assert headrace(["up", "--detach", "--state-dir", str(state), "-f", str(base), "--tick", "0.5"]) == 0
        store = DirStateStore(state)
        st = store.read()
        op = {"http": st["gateway"]["http"], "admin": st["admin_url"], "token": store.token()}
        status = call(op["admin"], op["token"], "GET", "/v1/status")
        cap = {d["name"]: d["capacity_rps"] for d in status["deployments"]}
        serving = digits_serving(status)
        rates = {"resnet50": a.load * cap["resnet50"], "digits": min(a.load * cap["digits"], 100.0),
                 "scaler": min(a.load * cap["scaler"], 35.0)}
        mix = ",".join(f"{m}:{r:.0f}" for m, r in rates.items())
        for i in range(a.rounds):
            for change in (False, True, "crash"):
                if change == "crash":
                    r = one_run(op, mix, sum(rates.values()), a.duration, 100 + i, None, tmp, kill=state)
                    op["admin"] = store.read()["admin_url"]  # the new controller's
                    runs.append(r)
                    print(f"{name} round {i} crash: attainment {r['attainment']:.4%} errors {r['errors']} "
                          f"unanswered {r['unanswered']} tritonclient failed {r['tritonclient']['failed']} "
                          f"{r['crash']}", flush=True)
                    continue
                # the swap removes whichever digits variant serves now; the user model flips version
                now = digits_serving(call(op["admin"], op["token"], "GET", "/v1/status"))
                other = 3 - version
                changes = [write(tmp / "double.yaml", documents(a100s, 400, DIGITS, other)),
                           write(tmp / "swap.yaml", documents(a100s, 400, [v for v in DIGITS if v != now], other)),
                           write(tmp / "back.yaml", documents(a100s, 200, DIGITS, other))]
                r = one_run(op, mix, sum(rates.values()), a.duration, 100 + i, changes if change else None, tmp)
                version = other if change else version
                runs.append(r)
                print(f"{name} round {i} {'change' if change else 'steady'}: attainment {r['attainment']:.4%} "
                      f"refused {r['refused']:.3%} p99 {r['p99_ms']:.1f} ms errors {r['errors']} "
                      f"unanswered {r['unanswered']} tritonclient failed {r['tritonclient']['failed']} "
                      f"applies {[x['seconds'] for x in r['applies']]}", flush=True)
    finally:
        ensure_down(state)
    return summarize(runs, cap, mix, serving)


def summarize(runs: list[dict[str, Any]], cap: dict[str, float], mix: str, serving: str) -> dict[str, Any]:
    def med(change: bool | str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["change"] == change)

    crashes = [r["crash"] for r in runs if r["change"] == "crash"]
    backs = [c["back_s"] for c in crashes if c["back_s"] is not None]
    return {
        "capacity_rps": cap, "mix": mix, "digits_serving_at_start": serving,
        "median": {k: {"steady": med(False, k), "change": med(True, k), "crash": med("crash", k)}
                   for k in ("attainment", "refused", "late", "p99_ms")},
        "attainment_drop_points": round((med(False, "attainment") - med(True, "attainment")) * 100, 3),
        "crash_attainment_drop_points": round((med(False, "attainment") - med("crash", "attainment")) * 100, 3),
        "crash_back_s_max": max(backs) if len(backs) == len(crashes) else None,
        "crash_all_adopted": all(c["adopted"] and c["generation_kept"] for c in crashes),
        "errors": sum(r["errors"] for r in runs), "unanswered": sum(r["unanswered"] for r in runs),
        "tritonclient_failed": sum(r["tritonclient"]["failed"] for r in runs),
        "runs": runs,
    }


def applied(run: dict[str, Any]) -> str:
    if run.get("crash"):
        c = run["crash"]
        return f"controller killed: back in {c['back_s']} s, adopted {c['adopted'] and c['generation_kept']}"
    return ", ".join(f"{y['seconds']} ({y['steps']})" for y in run["applies"]) or "-"


def render(r: dict[str, Any]) -> str:
    lines = [
        "# Live re-plan under load (`bench/replan.py`)", "",
        f"Open-loop Poisson at {r['load']:.0%} of planned capacity, {r['duration_s']:g} s per run, {r['rounds']} "
        "rounds per pool, commit " + r["commit"] + ". Each change run applies three generations inside its window: "
        "ResNet-50's rate doubled (capacity added) with the user's python-backend model rolled out at its other "
        "version, the serving digits variant removed (another started, the old one drained), then the rate "
        "back. Each crash run kills the controller (SIGKILL) 2 s in; its supervisor starts it again.", "",
    ]
    for name, p in r["pools"].items():
        lines += [
            f"## Pool `{name}` ({p['mix']} req/s)", "",
            "| run | round | attainment | refused | late | p99 ms | errors | unanswered | tritonclient sent / failed "
            "| apply seconds (steps), or the crash | CPU stolen |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for i, x in enumerate(p["runs"]):
            tc = x["tritonclient"]
            steal = "-" if x["steal"] is None else f"{x['steal']:.1%}"
            kind = "crash" if x["change"] == "crash" else "change" if x["change"] else "steady"
            lines.append(f"| {kind} | {i // 3} | {x['attainment']:.3%} | "
                         f"{x['refused']:.3%} | {x['late']:.3%} | {x['p99_ms']:.1f} | {x['errors']} | "
                         f"{x['unanswered']} | {tc['sent']} / {tc['failed']} | {applied(x)} | {steal} |")
        m = p["median"]
        lines += [
            "", "| median | steady | change | crash |", "|---|---|---|---|",
            *(f"| {k} | {m[k]['steady']:.4g} | {m[k]['change']:.4g} | {m[k]['crash']:.4g} |" for k in m),
            "", f"Attainment drop in the change window: **{p['attainment_drop_points']:+.2f} points** "
            f"(target: within 1); in the crash window: **{p['crash_attainment_drop_points']:+.2f} points**. "
            f"Errors {p['errors']}, unanswered {p['unanswered']}, tritonclient failures "
            f"{p['tritonclient_failed']} over all runs. After each kill -9 of the controller, it was back in at most "
            f"**{p['crash_back_s_max']} s** (target: 10), every process adopted (same pids, same generation): "
            f"**{p['crash_all_adopted']}**.", "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
