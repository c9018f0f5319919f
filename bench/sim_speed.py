"""How fast ``headrace sim`` runs: simulated requests per wall minute on one core.

Each case is one ``headrace sim`` command run in this process (its whole work: arrivals, the
gateway's own ``EdfScheduler`` in virtual time, the load-test recorder and report), timed
with ``time.perf_counter``; the best of ``--repeat`` runs counts (a busy host only slows a
run down). The target is 1.5M simulated requests per wall minute per core with the default
policy. Cases:

- ``issue``: one ResNet-50 replica on a 1g.10gb slice at 330 req/s Poisson, 600 s virtual
  (the run the speed was first measured on: about 198k requests);
- ``fleet``: four replicas at 1,300 req/s of Gamma cv 4 arrivals, 150 s virtual;
- ``groups``: eight models that share nothing (one replica each, a ``headrace serve`` config)
  at 300 req/s Poisson each, 75 s virtual, simulated in two worker processes (``--processes
  2``) whose recorders merge exactly: the per-core figure divides by the processes' CPU seconds
  (the parent's and its workers'), the wall figure shows both cores at work.

Then the fleet hour (``--hour-slice``, default 20 s): the issue's one-hour Azure-shaped
multi-model trace at 20,000 req/s (72M requests) on the fleet generator's 1,000 models
(``bench.fleet``, rates scaled to that total, planned and rendered as the operator does), each
model's per-minute rate shaped by the bundled Azure-format sample as ``bench.fleet_study``
writes it. Only a slice of it is simulated (two processes); the full hour's wall time is
extrapolated from the slice's rate, and said to be so.

Run it under the machine-wide bench lock::

    flock /tmp/headrace-bench.lock .venv/bin/python -m bench.sim_speed
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import resource
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


def run_case(args: list[str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of this process and its workers, simulated requests) of one
    ``headrace sim`` run; on a shared host the CPU seconds say what the run itself cost."""
    from deploy.cli import main

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
    return wall, cpu, int(s["offered"]) + int(s.get("warmup_offered", 0))


HOUR_RATE, HOUR_MODELS, HOUR_GPUS = 20_000.0, 1000, 500


def hour_slice(slice_s: float, settings: list[str], processes: int = 2) -> dict[str, Any]:
    """Simulate the first ``slice_s`` seconds of the fleet hour; its rate and the hour's
    extrapolated wall time."""
    from bench.fleet import SEED, generate
    from bench.fleet_study import write_trace
    from loadgen.sim_cli import SIM_TARGET
    from loadgen.sim_fleet import load_fleet
    from loadgen.sim_run import SimOptions, run_sim
    from loadgen.spec import LoadSpec

    planned = sum(d["spec"]["rate"] for d in generate(HOUR_MODELS, HOUR_GPUS, SEED).deployments)
    scale = HOUR_RATE / planned
    with tempfile.TemporaryDirectory(prefix="headrace-sim-hour-") as tmp:
        t0 = time.perf_counter()
        written = generate(HOUR_MODELS, HOUR_GPUS, SEED, scale).write(Path(tmp) / "fleet")
        profiles = written["profiles"].rename(Path(tmp) / "profiles.yaml")
        overrides = dict(kv.split("=", 1) for kv in settings)
        fleet = load_fleet([Path(tmp) / "fleet"], overrides, profiles=[profiles])
        trace = Path(tmp) / "trace.csv"
        offered = write_trace(fleet, trace, 61, 60.0, SEED)
        setup = time.perf_counter() - t0
        spec = LoadSpec(target=SIM_TARGET, arrival="trace", trace=trace, trace_models=tuple(fleet.models),
                        trace_cv=2.0, time_scale=1.0, duration_s=slice_s, warmup_s=0.0, seed=SEED, window_s=10.0)
        t1, c1 = time.perf_counter(), _cpu()
        summary, _ = run_sim(fleet, spec, SimOptions(processes=processes))
        wall, cpu = time.perf_counter() - t1, _cpu() - c1
        core = core_share(fleet, spec)
    n = summary["offered"] + summary.get("warmup_offered", 0)
    per_wall_min = n / wall * 60
    hour_requests = offered * 3600
    return {"models": len(fleet.models), "replicas": len(fleet.replicas), "gpus": fleet.plan["gpus"],
            "rate_scale": round(scale, 5), "trace_mean_rps": round(offered, 1), "slice_s": slice_s,
            "processes": processes, "groups": summary["sim"]["groups"], "requests": n,
            "setup_s": round(setup, 1), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "requests_per_wall_minute": round(per_wall_min), "requests_per_cpu_minute": round(n / cpu * 60),
            "attainment": summary["attainment"], "hour_requests": round(hour_requests),
            "hour_wall_minutes_extrapolated": round(hour_requests / per_wall_min, 1),
            "core": {**core, "hour_floor_minutes": round(hour_requests * core["core_us_per_request"] * 1e-6
                                                         / processes / 60, 1)}}


def core_share(fleet: Any, spec: Any) -> dict[str, Any]:
    """The slice again on one core, the gateway's ``EdfScheduler`` (which the simulator runs by
    design) timed apart: its seconds per request are a floor no simulator around it can beat."""
    import loadgen.sim_run as sim_run
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


def measure(repeat: int, settings: list[str]) -> dict[str, Any]:
    cases = {}
    extra = [x for kv in settings for x in ("--set", kv)]
    for name, args in CASES.items():
        args = [*args, *extra]
        runs = [run_case(args) for _ in range(repeat)]
        wall, cpu, n = min(runs)
        cases[name] = {"command": "headrace sim " + " ".join(args), "requests": n,
                       "wall_s": [round(w, 3) for w, _, _ in runs], "best_wall_s": round(wall, 3),
                       "cpu_s": round(cpu, 3), "requests_per_wall_minute": round(n / wall * 60),
                       "requests_per_cpu_minute": round(n / cpu * 60)}
    return cases


def markdown(res: dict[str, Any]) -> str:
    lines = ["# headrace sim: simulated requests per wall minute and per core", "",
             f"Target: {TARGET_PER_MIN / 1e6:.1f}M per wall minute per core with the default policy. "
             f"Host: {res['host']['cpus']} CPUs, Python {res['host']['python']}; best of "
             f"{res['repeat']} runs, each a whole `headrace sim` command in-process; host load average "
             f"{res['host']['load_average']:.2f} at the start. Each simulating process is single-threaded, so "
             "CPU seconds (the process's and its workers') are the wall time of free cores: the per-core "
             "target is judged on them (a shared host's other work stretches wall time, not CPU time). "
             "`groups` splits models that share nothing over two worker processes: its wall figure is "
             "both cores together."
             + (f" Every case runs with `--set {' --set '.join(res['settings'])}`." if res.get("settings") else ""),
             "",
             "| case | command | requests | wall s | CPU s | per wall minute | per CPU minute | target met |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for name, c in res["cases"].items():
        met = "yes" if c["requests_per_cpu_minute"] >= TARGET_PER_MIN else "no"
        lines.append(f"| {name} | `{c['command']}` | {c['requests']:,} | {c['best_wall_s']:.2f} | "
                     f"{c['cpu_s']:.2f} | {c['requests_per_wall_minute'] / 1e6:.2f}M | "
                     f"{c['requests_per_cpu_minute'] / 1e6:.2f}M | {met} |")
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
                         f"{bh['hour_wall_minutes_extrapolated']:g} minutes for the hour extrapolated")
    h = res.get("hour")
    if h:
        lines += ["", "## The fleet hour (extrapolated from a slice)", "",
                  f"The issue's one-hour trace: {h['models']:,} generated models (`bench.fleet`, rates x{h['rate_scale']:g} "
                  f"to a {HOUR_RATE:,.0f} req/s total), planned onto {h['gpus']} GPUs ({h['replicas']:,} replicas, "
                  f"{h['groups']:,} groups that share nothing), each model's minutes shaped by the Azure-format "
                  f"sample: {h['trace_mean_rps']:,.0f} req/s on average, {h['hour_requests'] / 1e6:.1f}M requests "
                  f"in the hour. Setup (generate, plan, render, write the trace): {h['setup_s']:g} s.", "",
                  f"The first {h['slice_s']:g} s ({h['requests']:,} requests) took {h['wall_s']:g} s wall in "
                  f"{h['processes']} processes ({h['cpu_s']:g} CPU s): {h['requests_per_wall_minute'] / 1e6:.2f}M "
                  f"per wall minute, {h['requests_per_cpu_minute'] / 1e6:.2f}M per CPU minute. At that rate the "
                  f"hour would take **{h['hour_wall_minutes_extrapolated']:g} minutes** of wall time (target 30); "
                  "extrapolated, not run: later minutes of the trace run at other rates, and a longer run "
                  "holds more state.", ""]
        c = h.get("core")
        if c:
            lines += [f"The floor: the same slice on one core with the gateway's `EdfScheduler` (submit, poll, "
                      f"on_complete; the simulator runs it by design) timed apart: {c['core_s']:g} of "
                      f"{c['cpu_s']:g} CPU s ({c['core_share']:.0%}), {c['core_us_per_request']:g} µs of "
                      f"{c['sim_us_per_request']:g} µs per request. With this scheduler the hour cannot take less "
                      f"than **{c['hour_floor_minutes']:g} minutes** on {h['processes']} cores, however little "
                      "the simulator around it costs.", ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="sim_speed")
    ap.add_argument("--baseline", help="an earlier result JSON to show beside this one")
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                    help="a scheduler setting for every case (headrace sim --set)")
    ap.add_argument("--hour-slice", type=float, default=20.0,
                    help="seconds of the fleet hour to simulate and extrapolate from (0: skip it)")
    a = ap.parse_args()
    host = {"cpus": os.cpu_count(), "python": platform.python_version(), "load_average": os.getloadavg()[0]}
    res: dict[str, Any] = {"repeat": a.repeat, "host": host, "settings": a.settings,
                           "cases": measure(a.repeat, a.settings)}
    if a.hour_slice > 0:
        res["hour"] = hour_slice(a.hour_slice, a.settings)
    if a.baseline:
        res["baseline"] = json.loads(Path(a.baseline).read_text())
        res["baseline"].pop("baseline", None)
    from loadgen.record import headrace_version

    res["commit"] = headrace_version()["commit"]
    write_results(a.out, a.name, res, markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
