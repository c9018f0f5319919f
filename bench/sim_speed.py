"""How fast ``headrace sim`` runs: simulated requests per wall minute on one core.

Each case is one ``headrace sim`` command run in a fresh process (its whole work: arrivals,
the gateway's own ``EdfScheduler`` in virtual time, the load-test recorder and report, timed
inside the process with ``time.perf_counter``), once with the core as pure Python
(``HEADRACE_COMPILED=0``) and once compiled (``headrace compile``: the same sources built by
Cython), alternately, ``--repeat`` times; the best run of each mode counts (a busy host only
slows a run down) and their ratio is the compiled core's speed-up, measured in the same run.
The target is 1.5M simulated requests per wall minute per core with the default policy. Cases:

- ``issue``: one ResNet-50 replica on a 1g.10gb slice at 330 req/s Poisson, 600 s virtual
  (the run the speed was first measured on: about 198k requests);
- ``fleet``: four replicas at 1,300 req/s of Gamma cv 4 arrivals, 150 s virtual;
- ``groups``: eight models that share nothing (one replica each, a ``headrace serve`` config)
  at 300 req/s Poisson each, 75 s virtual, simulated in two worker processes (``--processes
  2``) whose recorders merge exactly: the per-core figure divides by the processes' CPU seconds
  (the parent's and its workers'), the wall figure shows both cores at work.

Then the fleet hour (``--hour-slice``, default 20 s), in this process's mode (compiled when
built): the issue's one-hour Azure-shaped multi-model trace at 20,000 req/s (72M requests) on
the fleet generator's 1,000 models (``bench.fleet``, rates scaled to that total, planned and
rendered as the operator does), each model's per-minute rate shaped by the bundled
Azure-format sample as ``bench.fleet_study`` writes it. A slice of it and a quarter of that
slice are simulated (two processes): their difference is the cost per request, what is left
the cost of setting up the 1,000 groups, paid once an hour. The hour is extrapolated from those
two, and said to be so; ``--hour-full`` runs the whole hour instead (cases skipped; results in
``sim_speed_hour``).

Run it under the machine-wide bench lock::

    flock /tmp/headrace-bench.lock .venv/bin/python -m bench.sim_speed
    flock /tmp/headrace-bench.lock .venv/bin/python -m bench.sim_speed --hour-full
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.output import write_results

TARGET_PER_MIN = 1.5e6
GROUP_MODELS = 8
CASES: dict[str, list[str]] = {
    "issue": ["--rate", "330", "--arrival", "poisson", "--duration", "600"],
    "fleet": ["--replicas", "4", "--rate", "1300", "--arrival", "gamma", "--cv", "4", "--duration", "150"],
    "groups": ["-f", "{groups}", "--rate", str(300 * GROUP_MODELS), "--arrival", "poisson", "--duration", "75",
               "--processes", "2"],
}


def groups_config(path: Path) -> Path:
    """A ``headrace serve`` config of GROUP_MODELS models, one ResNet-50 replica on a slice each."""
    doc = {"models": [{"name": f"m{k}", "slo_ms": 100, "max_batch": 32, "replicas": [
        {"url": f"127.0.0.1:{9000 + k}", "variant": "resnet50", "id": f"m{k}-r0",
         "profile": "resnet50@A100-80GB/1g.10gb"}]} for k in range(GROUP_MODELS)]}
    path.write_text(yaml.safe_dump(doc))
    return path


def _cpu() -> float:
    """CPU seconds of this process and of its waited-for children (the sim's workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_case(args: list[str], compiled: bool) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of the process and its workers, simulated requests) of one
    ``headrace sim`` run in a fresh process with the core compiled or as pure Python."""
    env = {**os.environ, "HEADRACE_COMPILED": "1" if compiled else "0"}
    out = subprocess.run([sys.executable, "-m", "bench.sim_speed", "--child", json.dumps(args)],
                         capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"headrace sim {' '.join(args)} failed: {out.stderr[-2000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if r["compiled"] != compiled:
        raise RuntimeError(f"asked for the core {'compiled' if compiled else 'as Python'}, ran the other "
                           "(run `headrace compile` first)")
    return r["wall"], r["cpu"], r["requests"]


def _child(args: list[str]) -> None:
    """One case, timed inside this process; prints its figures as one JSON line."""
    import gateway.policy.scheduler as core
    from deploy.cli import main
    from profiles.compiled import compiled

    with tempfile.TemporaryDirectory() as tmp:
        args = [a.replace("{groups}", str(groups_config(Path(tmp) / "groups.yaml"))) for a in args]
        out = Path(tmp) / "s.json"
        sink = io.StringIO()
        t0, c0 = time.perf_counter(), _cpu()
        with contextlib.redirect_stdout(sink):
            rc = main(["sim", *args, "--seed", "0", "--json", str(out)])
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
        if rc != 0:
            raise RuntimeError(f"headrace sim {' '.join(args)} exited {rc}")
        s = json.loads(out.read_text())
    print(json.dumps({"wall": wall, "cpu": cpu, "requests": int(s["offered"]) + int(s.get("warmup_offered", 0)),
                      "compiled": compiled(core)}))


HOUR_RATE, HOUR_MODELS, HOUR_GPUS = 20_000.0, 1000, 500


def hour(slices: list[float], settings: list[str], processes: int = 2, floor: bool = True) -> dict[str, Any]:
    """Simulate the first seconds of the fleet hour, once per entry of ``slices`` (the whole
    hour: ``[3600]``); with two slices, the hour's wall time extrapolated from them: their
    difference is the cost per request, the rest the groups' setup, paid once."""
    from bench.fleet import SEED, generate
    from bench.fleet_study import write_trace
    from gateway.policy import scheduler as core
    from loadgen.sim.cli import SIM_TARGET
    from loadgen.sim.fleet import load_fleet
    from loadgen.sim.run import SimOptions, run_sim
    from loadgen.spec import LoadSpec
    from profiles.compiled import compiled

    planned = sum(d["spec"]["rate"] for d in generate(HOUR_MODELS, HOUR_GPUS, SEED).deployments)
    scale = HOUR_RATE / planned
    runs = []
    with tempfile.TemporaryDirectory(prefix="headrace-sim-hour-") as tmp:
        t0 = time.perf_counter()
        written = generate(HOUR_MODELS, HOUR_GPUS, SEED, scale).write(Path(tmp) / "fleet")
        profiles = written["profiles"].rename(Path(tmp) / "profiles.yaml")
        overrides = dict(kv.split("=", 1) for kv in settings)
        fleet = load_fleet([Path(tmp) / "fleet"], overrides, profiles=[profiles])
        trace = Path(tmp) / "trace.csv"
        offered = write_trace(fleet, trace, 61, 60.0, SEED)
        setup = time.perf_counter() - t0
        for slice_s in slices:
            spec = LoadSpec(target=SIM_TARGET, arrival="trace", trace=trace, trace_models=tuple(fleet.models),
                            trace_cv=2.0, time_scale=1.0, duration_s=slice_s, warmup_s=0.0, seed=SEED,
                            window_s=10.0)
            t1, c1 = time.perf_counter(), _cpu()
            summary, _ = run_sim(fleet, spec, SimOptions(processes=processes))
            wall, cpu = time.perf_counter() - t1, _cpu() - c1
            n = summary["offered"] + summary.get("warmup_offered", 0)
            runs.append({"slice_s": slice_s, "requests": n, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                         "requests_per_wall_minute": round(n / wall * 60),
                         "requests_per_cpu_minute": round(n / cpu * 60), "attainment": summary["attainment"],
                         "groups": summary["sim"]["groups"]})
        floor_of = core_share(fleet, spec) if floor else None
    hour_requests = offered * 3600
    out: dict[str, Any] = {
        "models": len(fleet.models), "replicas": len(fleet.replicas), "gpus": fleet.plan["gpus"],
        "rate_scale": round(scale, 5), "trace_mean_rps": round(offered, 1), "processes": processes,
        "compiled": compiled(core), "setup_s": round(setup, 1), "runs": runs, "hour_requests": round(hour_requests)}
    if len(runs) == 2:
        a, b = runs
        dn = b["requests"] - a["requests"]
        for unit in ("wall", "cpu"):
            per = (b[f"{unit}_s"] - a[f"{unit}_s"]) / dn
            fixed = b[f"{unit}_s"] - b["requests"] * per
            out[f"{unit}_us_per_request"] = round(per * 1e6, 2)
            out[f"{unit}_fixed_s"] = round(fixed, 2)
            out[f"hour_{unit}_minutes_extrapolated"] = round((fixed + hour_requests * per) / 60, 1)
    if floor_of:
        out["core"] = {**floor_of, "hour_floor_minutes": round(
            hour_requests * floor_of["core_us_per_request"] * 1e-6 / processes / 60, 1)}
    return out


def core_share(fleet: Any, spec: Any) -> dict[str, Any]:
    """The slice again on one core, the gateway's ``EdfScheduler`` (which the simulator runs by
    design) timed apart: its seconds per request are a floor no simulator around it can beat."""
    import loadgen.sim.run as sim_run
    from gateway.policy import EdfScheduler

    spent = [0.0]

    def timed(method):  # type: ignore[no-untyped-def]
        def call(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - t
        return call

    Timed = type("Timed", (EdfScheduler,), {name: timed(getattr(EdfScheduler, name))
                                            for name in ("submit", "poll", "on_complete")})
    sim_run.EdfScheduler = Timed  # NOTE: this process only (the run above used its workers)
    try:
        c0 = _cpu()
        summary, _ = sim_run.run_sim(fleet, spec, sim_run.SimOptions(processes=1))
        cpu = _cpu() - c0
    finally:
        sim_run.EdfScheduler = EdfScheduler
    n = summary["offered"] + summary.get("warmup_offered", 0)
    return {"requests": n, "cpu_s": round(cpu, 2), "core_s": round(spent[0], 2),
            "core_share": round(spent[0] / cpu, 3), "core_us_per_request": round(spent[0] / n * 1e6, 1),
            "sim_us_per_request": round(cpu / n * 1e6, 1)}


def measure(repeat: int, settings: list[str], modes: tuple[bool, ...]) -> dict[str, Any]:
    """Each case in each mode (``True``: compiled), alternately, ``repeat`` times."""
    cases = {}
    extra = [x for kv in settings for x in ("--set", kv)]
    for name, args in CASES.items():
        args = [*args, *extra]
        runs: dict[bool, list] = {m: [] for m in modes}
        for _ in range(repeat):
            for m in modes:
                runs[m].append(run_case(args, m))
        by_mode = {}
        for m, rs in runs.items():
            wall, cpu, n = min(rs)
            by_mode["compiled" if m else "python"] = {
                "requests": n, "wall_s": [round(w, 3) for w, _, _ in rs], "best_wall_s": round(wall, 3),
                "cpu_s": round(cpu, 3), "requests_per_wall_minute": round(n / wall * 60),
                "requests_per_cpu_minute": round(n / cpu * 60)}
        cases[name] = {"command": "headrace sim " + " ".join(args), **by_mode}
        if len(by_mode) == 2:
            cases[name]["speedup"] = round(by_mode["compiled"]["requests_per_cpu_minute"]
                                           / by_mode["python"]["requests_per_cpu_minute"], 3)
    return cases


def _mode_cells(c: dict[str, Any] | None) -> list[str]:
    """One mode's four cells of a case's row (empty when the mode was not measured)."""
    if c is None:
        return [""] * 4
    return [f"{c['cpu_s']:.2f}", f"{c['requests_per_wall_minute'] / 1e6:.2f}M",
            f"{c['requests_per_cpu_minute'] / 1e6:.2f}M", "yes" if c["requests_per_cpu_minute"] >= TARGET_PER_MIN else "no"]


def markdown(res: dict[str, Any]) -> str:
    if not res["cases"] and res.get("hour"):  # --hour-full: the hour alone
        return "\n".join(["# headrace sim: the whole fleet hour", "",
                          f"Host: {res['host']['cpus']} CPUs, Python {res['host']['python']}; host load average "
                          f"{res['host']['load_average']:.2f} at the start.", *_hour_lines(res["hour"])]) + "\n"
    lines = ["# headrace sim: simulated requests per wall minute and per core", "",
             f"Target: {TARGET_PER_MIN / 1e6:.1f}M per wall minute per core with the default policy. "
             f"Host: {res['host']['cpus']} CPUs, Python {res['host']['python']}; each case a whole `headrace sim` "
             f"command in a fresh process, the core compiled (`headrace compile`) and as pure Python "
             f"alternately, best of {res['repeat']} runs each; host load average "
             f"{res['host']['load_average']:.2f} at the start. Each simulating process is single-threaded, so "
             "CPU seconds (the process's and its workers') are the wall time of free cores: the per-core "
             "target is judged on them (a shared host's other work stretches wall time, not CPU time). "
             "`groups` splits models that share nothing over two worker processes: its wall figure is "
             "both cores together."
             + (f" Every case runs with `--set {' --set '.join(res['settings'])}`." if res.get("settings") else ""),
             "",
             "| case | command | requests | compiled: CPU s | per wall minute | per CPU minute | target met "
             "| Python: CPU s | per wall minute | per CPU minute | target met | compiled / Python |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|---:|"]
    for name, c in res["cases"].items():
        n = (c.get("compiled") or c["python"])["requests"]
        cells = [name, f"`{c['command']}`", f"{n:,}", *_mode_cells(c.get("compiled")),
                 *_mode_cells(c.get("python")), f"{c['speedup']}x" if "speedup" in c else ""]
        lines.append("| " + " | ".join(cells) + " |")
    if res.get("baseline"):
        lines += ["", "Before (the same commands on the simulator before its speed-ups, "
                  f"{res['baseline'].get('label') or 'commit ' + str(res['baseline']['commit'])}):", ""]
        for name, c in res["baseline"]["cases"].items():
            lines.append(f"- {name}: {c['requests_per_wall_minute'] / 1e6:.2f}M per wall minute, "
                         f"{c['requests_per_cpu_minute'] / 1e6:.2f}M per CPU minute "
                         f"({c['requests']:,} requests in {c['best_wall_s']:.2f} s wall, {c['cpu_s']:.2f} s CPU)")
        bh = res["baseline"].get("hour")
        if bh:
            lines.append(f"- the fleet hour's first {bh['slice_s']:g} s: {bh['requests_per_wall_minute'] / 1e6:.2f}M per "
                         f"wall minute in {bh['processes']} processes ({bh['wall_s']:g} s wall, {bh['cpu_s']:g} s CPU), "
                         f"{bh['hour_wall_minutes_extrapolated']:g} minutes for the hour (its slice's rate extrapolated, "
                         "setup included)")
    h = res.get("hour")
    if h:
        lines += _hour_lines(h)
    return "\n".join(lines) + "\n"


def _hour_lines(h: dict[str, Any]) -> list[str]:
    full = len(h["runs"]) == 1 and h["runs"][0]["slice_s"] >= 3600
    lines = ["", "## The fleet hour" + ("" if full else " (extrapolated from two slices)"), "",
             f"The issue's one-hour trace: {h['models']:,} generated models (`bench.fleet`, rates x{h['rate_scale']:g} "
             f"to a {HOUR_RATE:,.0f} req/s total), planned onto {h['gpus']} GPUs ({h['replicas']:,} replicas, "
             f"{h['runs'][-1]['groups']:,} groups that share nothing), each model's minutes shaped by the Azure-format "
             f"sample: {h['trace_mean_rps']:,.0f} req/s on average, {h['hour_requests'] / 1e6:.1f}M requests "
             f"in the hour. Setup (generate, plan, render, write the trace): {h['setup_s']:g} s. The core "
             f"{'compiled' if h['compiled'] else 'as pure Python'}, {h['processes']} processes.", "",
             "| first seconds | requests | wall s | CPU s | per wall minute | per CPU minute | attainment |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in h["runs"]:
        lines.append(f"| {r['slice_s']:g} | {r['requests']:,} | {r['wall_s']:g} | {r['cpu_s']:g} | "
                     f"{r['requests_per_wall_minute'] / 1e6:.2f}M | {r['requests_per_cpu_minute'] / 1e6:.2f}M | "
                     f"{r['attainment']:.2%} |")
    lines.append("")
    if full:
        r = h["runs"][0]
        lines.append(f"The whole hour ran in **{r['wall_s'] / 60:.1f} minutes** of wall time (target 30); with "
                     f"the setup, {(r['wall_s'] + h['setup_s']) / 60:.1f} minutes.")
    elif "hour_wall_minutes_extrapolated" in h:
        lines.append(
            f"Between the two slices each request cost {h['wall_us_per_request']:g} µs of wall time "
            f"({h['cpu_us_per_request']:g} µs CPU over both processes); the rest, setting up the groups, "
            f"{h['wall_fixed_s']:g} s, is paid once. So the hour would take **{h['hour_wall_minutes_extrapolated']:g} "
            f"minutes** of wall time (target 30); extrapolated, not run: later minutes of the trace run at "
            "other rates, and a longer run holds more state.")
    lines.append("")
    c = h.get("core")
    if c:
        lines += [f"The floor: the last slice on one core with the gateway's `EdfScheduler` (submit, poll, "
                  f"on_complete; the simulator runs it by design) timed apart: {c['core_s']:g} of "
                  f"{c['cpu_s']:g} CPU s ({c['core_share']:.0%}), {c['core_us_per_request']:g} µs of "
                  f"{c['sim_us_per_request']:g} µs per request (setup included). With this scheduler the hour "
                  f"cannot take less than **{c['hour_floor_minutes']:g} minutes** on {h['processes']} cores, "
                  "however little the simulator around it costs.", ""]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", help="results file name (default: sim_speed; sim_speed_hour with --hour-full)")
    ap.add_argument("--baseline", help="an earlier result JSON to show beside this one")
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                    help="a scheduler setting for every case (headrace sim --set)")
    ap.add_argument("--hour-slice", type=float, default=20.0,
                    help="seconds of the fleet hour to simulate, and a quarter of it, to extrapolate from "
                    "(0: skip the hour)")
    ap.add_argument("--hour-full", action="store_true", help="run the whole fleet hour (cases skipped)")
    ap.add_argument("--python-only", action="store_true", help="measure the cases with the core as Python only")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.name = a.name or ("sim_speed_hour" if a.hour_full else "sim_speed")
    if a.child:
        _child(json.loads(a.child))
        return
    host = {"cpus": os.cpu_count(), "python": platform.python_version(), "load_average": os.getloadavg()[0]}
    res: dict[str, Any] = {"repeat": a.repeat, "host": host, "settings": a.settings}
    if a.hour_full:
        res["cases"] = {}
        res["hour"] = hour([3600.0], a.settings, floor=False)
    else:
        res["cases"] = measure(a.repeat, a.settings, (False,) if a.python_only else (False, True))
        if a.hour_slice > 0:
            res["hour"] = hour([a.hour_slice / 4, a.hour_slice], a.settings)
    if a.baseline:
        res["baseline"] = json.loads(Path(a.baseline).read_text())
        res["baseline"].pop("baseline", None)
    from loadgen.record import headrace_version

    res["commit"] = headrace_version()["commit"]
    write_results(a.out, a.name, res, markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
