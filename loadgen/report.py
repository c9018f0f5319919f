"""Load-test reports from a summary (``Recorder.summary`` plus run facts): a rich terminal
table, JSON, CSV with perf_analyzer-style columns where they mean the same, and PNG plots
(latency CDF; timeline of offered rate, goodput and p99) drawn with matplotlib's Agg backend.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from loadgen.stats import Recorder

# perf_analyzer names where the meaning is the same; latencies in µs as perf_analyzer writes
CSV_COLUMNS = (
    "Request Rate",
    "Concurrency",
    "Inferences/Second",
    "p50 latency",
    "p90 latency",
    "p95 latency",
    "p99 latency",
    "Avg latency",
    # headrace additions
    "p99.9 latency",
    "Offered",
    "OK",
    "Good",
    "SLO (ms)",
    "SLO Attainment",
    "Goodput/Second",
    "Rejected",
    "Expired",
    "Errors",
    "Send Lag p99 (us)",
    "Pool Wait p99 (us)",
)


def _f(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def _attainment(s: dict[str, Any]) -> str:
    """Attainment, or n/a when the run had no SLO to attain (or nothing was offered)."""
    return "n/a" if s["attainment"] is None else _pct(s["attainment"])


def latency_origin(s: dict[str, Any]) -> str:
    """What latencies count from, by how the run measured them."""
    if "sim" in s:
        return "from arrival, in virtual time"
    if s.get("mode") == "closed":
        return "from each send (closed loop)"
    return "from the scheduled send"


def _rejected(s: dict[str, Any]) -> str:
    """Refused at arrival (with how fast: p99 from the scheduled send, and from the actual one
    when the client's own send lag made a difference), plus those refused after queueing
    (expired) when there are any."""
    out = str(s["rejected"])
    sched, sent = s.get("reject_latency_p99_ms"), s.get("reject_latency_from_send_p99_ms")
    if s["rejected"] and sched is not None:
        lag = f", {sent:.1f} from send" if sent is not None and sched - sent >= 0.1 else ""
        out += f" (p99 {sched:.1f} ms{lag})"
    return f"{out} + {s['expired']} expired" if s.get("expired") else out


def compact(s: dict[str, Any]) -> str:
    """One line for scripts and READMEs: attainment, goodput, p50/p99, rejections, errors."""
    lat = s["latency_ms"]
    slo = f" within {s['slo_ms']:g} ms" if s.get("slo_ms") else ""
    return (
        f"attainment {_attainment(s)}{slo or ' (no SLO)'} | goodput {s['goodput_rps']:.1f}/s of "
        f"{s['offered_rps']:.1f}/s offered | p50 {_f(lat['p50'], '{:.2f}')} ms p99 "
        f"{_f(lat['p99'], '{:.2f}')} ms | rejected {_rejected(s)} | errors {s['error_count']}"
    )


def table(s: dict[str, Any]) -> Table:
    """The final terminal table: overall, then per model and per variant when there are
    several."""
    head = s.get("mode", "open")
    detail = f"{s.get('arrival')} {s['rate']:g}/s" if head == "open" and s.get("rate") else head
    if head == "closed":
        detail = f"closed loop, concurrency {s.get('concurrency')}"
    t = Table(
        title=f"headrace load: {s.get('target', '')} ({detail}, {s['duration_s']:.1f} s)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    for col in ("scope", "offered", "goodput", "in SLO", "p50", "p90", "p99", "p99.9", "rej",
                "err"):  # fmt: skip
        t.add_column(col, justify="left" if col == "scope" else "right")

    def row(name: str, d: dict[str, Any]) -> None:
        lat = d["latency_ms"]
        t.add_row(
            name,
            f"{d['offered_rps']:.1f}",
            f"{d['goodput_rps']:.1f}",
            _attainment(d),
            _f(lat["p50"], "{:.2f}"),
            _f(lat["p90"], "{:.2f}"),
            _f(lat["p99"], "{:.2f}"),
            _f(lat["p99.9"], "{:.2f}"),
            _rejected(d),
            str(d["error_count"]),
        )

    row("all", s)
    if len(s["per_model"]) > 1:
        for m, d in s["per_model"].items():
            row(m, d)
    if len(s["per_variant"]) > 1 or any(v["variant"] != "-" for v in s["per_variant"]):
        for d in s["per_variant"]:
            row(f"{d['model']}/{d['variant']}", d)
    lag = s["send_lag_ms"]
    slo = f"SLO {s['slo_ms']:g} ms" if s.get("slo_ms") else "no SLO (attainment n/a; goodput = OK answers)"
    pool = s.get("pool_wait_ms")
    waits = f"; pool wait p50 {pool['p50']:.3f} ms p99 {pool['p99']:.3f} ms" if pool else ""
    sends = "" if "sim" in s else (
        f"; send lag p50 {lag['p50'] or 0:.3f} ms p99 {lag['p99'] or 0:.3f} ms{waits}"
    )  # a simulator sends nothing
    mix = "".join(
        f"; {m}: " + ", ".join(f"{v} {share:.0%}" for v, share in d["shares"].items())
        + (f", mean accuracy {d['mean_accuracy']:.4f}" if d["mean_accuracy"] is not None else "")
        for m, d in s.get("variants", {}).items() if len(d["shares"]) > 1 or d["mean_accuracy"] is not None)
    t.caption = f"rates per second; latencies in ms {latency_origin(s)}; {slo}{sends}{mix}"
    return t


def print_report(s: dict[str, Any], console: Console | None = None) -> None:
    c = console or Console()
    c.print(table(s))
    for w in s.get("warnings", []):
        c.print(f"[yellow]warning:[/yellow] {w}")
    c.print(compact(s))


def trace_mapping(rows: list[tuple[int, str, int, str]], shown: int = 20) -> list[str]:
    """Lines saying which trace functions replay onto which models (rows of
    :meth:`loadgen.arrivals.AzureReplay.table`): the first ``shown`` in full, then per model
    how many functions and invocations it takes."""
    total = sum(n for _, _, n, _ in rows) or 1
    out = [f"trace mapping: {len(rows)} functions, {total:,} invocations in the minutes replayed"]
    out += [f"  #{rank:<5} {fn[:12]}  {n:>12,} ({n / total:6.2%})  -> {model}" for rank, fn, n, model in rows[:shown]]
    if len(rows) > shown:
        out.append(f"  ... {len(rows) - shown} more")
    per: dict[str, tuple[int, int]] = {}
    for _, _, n, model in rows:
        f, c = per.get(model, (0, 0))
        per[model] = (f + 1, c + n)
    out += [f"  {model}: {f} functions, {c:,} invocations ({c / total:.1%})" for model, (f, c) in per.items()]
    return out


def sweep_table(rows: list[dict[str, Any]], title: str) -> Table:
    """One row per run; search trials add their trial number, result and reason, and the
    verdict of their rate (the majority of its trials)."""
    t = Table(title=title)
    search = any("passed" in s for s in rows)
    cols = ["rate/s", "offered/s", "goodput/s", "attainment", "p50 ms", "p99 ms", "rejected",
            "errors", "send lag p99 ms", "pool wait p99 ms", "stable"]  # fmt: skip
    if search:
        cols[1:1] = ["trial"]
        cols += ["result", "rate verdict"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("result", "rate verdict") else "right")
    for s in rows:
        lat = s["latency_ms"]
        pool = s.get("pool_wait_ms")
        cells = [
            _f(s.get("rate"), "{:g}"),
            f"{s['offered_rps']:.1f}",
            f"{s['goodput_rps']:.1f}",
            _attainment(s),
            _f(lat["p50"], "{:.2f}"),
            _f(lat["p99"], "{:.2f}"),
            _rejected(s),
            str(s["error_count"]),
            _f(s["send_lag_ms"]["p99"], "{:.3f}"),
            _f(pool["p99"] if pool else None, "{:.3f}"),
            {True: "yes", False: "no"}.get(s.get("stable"), "-"),
        ]
        if search:
            cells[1:1] = [str(s.get("trial", "-"))]
            verdict = s.get("rate_verdict")
            cells += [
                "pass" if s.get("passed") else f"fail: {s.get('reason', '')}",
                "-" if verdict is None else verdict,
            ]
        t.add_row(*cells)
    return t


def pyplot():  # noqa: ANN201  (matplotlib.pyplot, on the Agg backend)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:  # noqa: ANN001
    """``fig`` laid out and written to ``path`` (its folder made), then closed."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def plot_sweep(rows: list[dict[str, Any]], prefix: Path, target: float | None = None) -> Path:
    """``PREFIX_sweep.png``: attainment and goodput against the offered rate (one point per
    run; a search marks passing trials o and failing ones x), p99 on the right axis."""
    plt = pyplot()
    fig, ax1 = plt.subplots(figsize=(8, 4.5))
    ax2 = ax1.twinx()
    pts = sorted(rows, key=lambda r: (r["rate"], r.get("trial", 0)))
    rates = [r["rate"] for r in pts]
    atts = [100 * (r["attainment"] or 0.0) for r in pts]
    if any("passed" in r for r in pts):
        for ok, marker, color in ((True, "o", "tab:green"), (False, "x", "tab:red")):
            sel = [(x, y) for x, y, r in zip(rates, atts, pts, strict=True) if r["passed"] == ok]
            if sel:
                ax1.scatter(*zip(*sel, strict=True), marker=marker, color=color,
                            label="trial passed" if ok else "trial failed")  # fmt: skip
    else:
        ax1.plot(rates, atts, marker="o", label="attainment %")
    if target is not None:
        ax1.axhline(100 * target, color="tab:green", linestyle="--", alpha=0.5,
                    label=f"target {target:.2%}")  # fmt: skip
    ax1.set_xlabel("offered rate (requests/s)")
    ax1.set_ylabel("SLO attainment (%)")
    p99 = [(r["rate"], r["latency_ms"]["p99"]) for r in pts if r["latency_ms"]["p99"] is not None]
    if p99:
        ax2.plot(*zip(*p99, strict=True), color="tab:purple", linestyle=":", marker=".",
                 label="p99 ms")  # fmt: skip
    ax2.set_ylabel("p99 latency (ms)")
    ax2.set_yscale("log")
    h1, l1 = ax1.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax1.legend(h1 + h2, l1 + l2, loc="lower left")
    ax1.set_title("attainment and p99 by offered rate")
    ax1.grid(True, alpha=0.3)
    return save_figure(fig, prefix.with_name(prefix.name + "_sweep.png"))


def to_json(s: dict[str, Any] | list[dict[str, Any]], path: Path) -> None:
    path.write_text(json.dumps(s, indent=2, default=str) + "\n")


def csv_row(s: dict[str, Any]) -> dict[str, Any]:
    lat = s["latency_ms"]

    def us(v: float | None) -> str:
        return "" if v is None else str(int(round(v * 1000)))

    return {
        "Request Rate": "" if s.get("rate") is None else s["rate"],
        "Concurrency": "" if s.get("concurrency") is None else s["concurrency"],
        "Inferences/Second": f"{s['throughput_rps']:.2f}",
        "p50 latency": us(lat["p50"]),
        "p90 latency": us(lat["p90"]),
        "p95 latency": us(lat["p95"]),
        "p99 latency": us(lat["p99"]),
        "Avg latency": us(lat["mean"]),
        "p99.9 latency": us(lat["p99.9"]),
        "Offered": s["offered"],
        "OK": s["ok"],
        "Good": s["good"],
        "SLO (ms)": "" if s.get("slo_ms") is None else s["slo_ms"],
        "SLO Attainment": "" if s["attainment"] is None else f"{s['attainment']:.6f}",
        "Goodput/Second": f"{s['goodput_rps']:.2f}",
        "Rejected": s["rejected"],
        "Expired": s.get("expired", 0),
        "Errors": s["error_count"],
        "Send Lag p99 (us)": us(s["send_lag_ms"]["p99"]),
        "Pool Wait p99 (us)": us((s.get("pool_wait_ms") or {}).get("p99")),
    }


def to_csv(rows: list[dict[str, Any]], path: Path | None = None) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
    w.writeheader()
    for s in rows:
        w.writerow(csv_row(s))
    if path is not None:
        path.write_text(buf.getvalue())
    return buf.getvalue()


def plot(s: dict[str, Any], rec: Recorder, prefix: Path) -> list[Path]:
    """``PREFIX_cdf.png`` (latency CDF per model) and ``PREFIX_timeline.png``."""
    plt = pyplot()
    out = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = {"all": rec.total(), **rec.by_model()} if len(rec.by_model()) > 1 else {
        "all": rec.total()
    }  # fmt: skip
    for name, ser in series.items():
        h = ser.latency
        if not h.get_total_count():
            continue
        xs, ys = [], []
        for it in h.get_percentile_iterator(5):
            xs.append(it.value_iterated_to / 1e3)
            ys.append(it.percentile_level_iterated_to / 100.0)
        ax.plot(xs, ys, label=name)
    if s.get("slo_ms"):
        ax.axvline(s["slo_ms"], color="red", linestyle="--", label=f"SLO {s['slo_ms']:g} ms")
    ax.set_xscale("log")
    ax.set_xlabel(f"latency {latency_origin(s)} (ms)")
    ax.set_ylabel("fraction of OK answers")
    ax.set_title("latency CDF")
    ax.grid(True, alpha=0.3)
    ax.legend()
    out.append(save_figure(fig, prefix.with_name(prefix.name + "_cdf.png")))

    tl = s["timeline"]
    fig, ax1 = plt.subplots(figsize=(8, 4.5))
    t = [r["t"] for r in tl]
    ax1.plot(t, [r["offered_rps"] for r in tl], label="offered /s", drawstyle="steps-post")
    ax1.plot(t, [r["goodput_rps"] for r in tl], label="goodput /s", drawstyle="steps-post")
    ax1.set_xlabel("time (s, by send)" if s.get("mode") == "closed" else "time (s, by scheduled send)")
    ax1.set_ylabel("requests per second")
    ax2 = ax1.twinx()
    ax2.plot(t, [r["p99_ms"] for r in tl], color="tab:red", linestyle=":", label="p99 ms")
    ax2.set_ylabel("p99 latency (ms)")
    if s.get("slo_ms"):
        ax2.axhline(s["slo_ms"], color="tab:red", alpha=0.3)
    lines = ax1.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax1.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left")
    ax1.set_title("offered rate, goodput and p99 over time")
    ax1.grid(True, alpha=0.3)
    out.append(save_figure(fig, prefix.with_name(prefix.name + "_timeline.png")))
    return out
