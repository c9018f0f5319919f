"""Generative load reports: a rich terminal table of one run (TTFT, TPOT, ITL and end-to-end
percentiles, token and request throughput, SLO attainment and goodput), a table of a goodput
search, JSON, and PNG plots (TTFT and TPOT CDFs; attainment and goodput by load) drawn with
matplotlib's Agg backend."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from loadgen.llm.driver import Outcome
from loadgen.report import pyplot, save_figure


def fmt(v: float | None, spec: str = "{:.1f}") -> str:
    """A number in ``spec``'s format, or ``-`` for none."""
    return "-" if v is None else spec.format(v)


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def compact(s: dict[str, Any]) -> str:
    """One line: requests, attainment, goodput, TTFT and TPOT p50/p99."""
    return (f"{s['ok']}/{s['offered']} ok, both SLOs {_pct(s['attainment'])} "
            f"(TTFT {_pct(s['attainment_ttft'])}, TPOT {_pct(s['attainment_tpot'])}), "
            f"goodput {fmt(s['goodput_rps'], '{:.2f}')}/s, "
            f"TTFT p50/p99 {fmt(s['ttft_ms']['p50'])}/{fmt(s['ttft_ms']['p99'])} ms, "
            f"TPOT p50/p99 {fmt(s['tpot_ms']['p50'], '{:.2f}')}/{fmt(s['tpot_ms']['p99'], '{:.2f}')} ms")


def table(s: dict[str, Any], title: str = "headrace load llm") -> Table:
    t = Table(title=title, box=box.SIMPLE_HEAD)
    t.add_column("ms (from scheduled send)")
    for c in ("p50", "p90", "p99", "mean", "max"):
        t.add_column(c, justify="right")
    for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("end-to-end", "e2e_ms"),
                      ("send lag", "send_lag_ms")):
        d = s[key]
        t.add_row(name, *(fmt(d[c], "{:.2f}") for c in ("p50", "p90", "p99", "mean", "max")))
    return t


def print_report(s: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    console.print(table(s))
    slo = ", ".join(f"{n} {v:g} ms" for n, v in (("TTFT", s["slo_ttft_ms"]), ("TPOT", s["slo_tpot_ms"]))
                    if v is not None) or "none"
    lines = [
        f"requests: {s['offered']} offered ({fmt(s['offered_rps'], '{:.2f}')}/s), {s['ok']} ok, "
        f"{s['error_count']} failed {s['errors'] or ''}".rstrip(),
        f"throughput: {s['throughput_rps']:.2f} req/s, {s['input_tokens_per_s']:.0f} input tok/s, "
        f"{s['output_tokens_per_s']:.0f} output tok/s over {s['elapsed_s']:.1f} s",
        f"SLOs ({slo}): both {_pct(s['attainment'])}, TTFT {_pct(s['attainment_ttft'])}, "
        f"TPOT {_pct(s['attainment_tpot'])}; goodput {fmt(s['goodput_rps'], '{:.2f}')} req/s",
    ]
    if s.get("prefix_cache_hit_rate") is not None:
        lines.append(f"prefix cache: {_pct(s['prefix_cache_hit_rate'])} of prompt tokens (usage)")
    if s["output_tokens_short"]:
        lines.append(f"warning: {s['output_tokens_short']} answers streamed fewer or more tokens than asked")
    for line in lines:
        console.print(line, markup=False, highlight=False)


def search_table(rows: list[dict[str, Any]], target: float) -> Table:
    t = Table(title=f"goodput search: highest load with {target:.0%} meeting both SLOs", box=box.SIMPLE_HEAD)
    for c in ("load", "offered/s", "ok", "TTFT att.", "TPOT att.", "both", "goodput/s", "TTFT p99 ms",
              "TPOT p99 ms", "verdict"):
        t.add_column(c, justify="right")
    for s in rows:
        t.add_row(f"{s['load']:g}", fmt(s["offered_rps"], "{:.2f}"), f"{s['ok']}/{s['offered']}",
                  _pct(s["attainment_ttft"]), _pct(s["attainment_tpot"]), _pct(s["attainment"]),
                  fmt(s["goodput_rps"], "{:.2f}"), fmt(s["ttft_ms"]["p99"]), fmt(s["tpot_ms"]["p99"], "{:.2f}"),
                  "pass" if s["passed"] else "fail")
    return t


def to_json(doc: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")


def plot_cdf(outcomes: list[Outcome], s: dict[str, Any], path: Path) -> Path:
    """TTFT and TPOT CDFs of the answered requests, with the SLOs marked."""
    from matplotlib.ticker import NullFormatter

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ok = [o for o in outcomes if o.ok]
    for ax, name, vals, slo in (
        (axes[0], "TTFT", sorted(o.ttft * 1e3 for o in ok if o.ttft is not None), s["slo_ttft_ms"]),
        (axes[1], "TPOT", sorted(o.tpot * 1e3 for o in ok if o.tpot is not None and o.output_tokens > 1),
         s["slo_tpot_ms"]),
    ):
        if vals:
            ax.plot(vals, [(i + 1) / len(vals) for i in range(len(vals))], drawstyle="steps-post")
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # decades only: minor labels overlap
        if slo is not None:
            ax.axvline(slo, color="red", linestyle="--", label=f"SLO {slo:g} ms")
            ax.legend()
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of answered requests")
        ax.set_title(f"{name} CDF")
        ax.grid(True, alpha=0.3)
    return save_figure(fig, path)


def plot_search(rows: list[dict[str, Any]], target: float, path: Path) -> Path:
    """Attainment (each SLO and both) and goodput against the offered rate."""
    plt = pyplot()
    fig, ax1 = plt.subplots(figsize=(8, 4.5))
    xs = [r["offered_rps"] or 0.0 for r in rows]
    for key, label in (("attainment", "both SLOs"), ("attainment_ttft", "TTFT"), ("attainment_tpot", "TPOT")):
        if any(r[key] is not None for r in rows):
            ax1.plot(xs, [100 * (r[key] or 0.0) for r in rows], marker="o", label=label)
    ax1.axhline(100 * target, color="tab:green", linestyle="--", alpha=0.5, label=f"target {target:.0%}")
    ax1.set_xlabel("offered rate (requests/s)")
    ax1.set_ylabel("SLO attainment (%)")
    ax2 = ax1.twinx()
    ax2.plot(xs, [r["goodput_rps"] or 0.0 for r in rows], color="tab:purple", linestyle=":", marker=".",
             label="goodput /s")
    ax2.set_ylabel("goodput (requests/s)")
    h1, l1 = ax1.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax1.legend(h1 + h2, l1 + l2, loc="lower left")
    ax1.set_title("attainment and goodput by offered rate")
    ax1.grid(True, alpha=0.3)
    return save_figure(fig, path)
