"""``headrace load``: clear one-line errors, and a full run writing the compact report, JSON,
CSV (perf_analyzer columns) and plots against a standalone v2 test server."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from deploy.cli import main
from loadgen.report import CSV_COLUMNS
from profiles.triton.server import free_port


@pytest.fixture(scope="module")
def server():
    """``python -m loadgen.testserver`` in its own process group, stopped by PID."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loadgen.testserver",
            "--http-port",
            str(port),
            "--variant",
            "small",
        ],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("test server did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["load", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--target", "ftp://h:1", "--model", "m"], "--target = 'ftp://h:1'"),
        (
            ["--target", "http://h:1", "--model", "m", "--rate", "0"],
            "--rate = 0.0: Input should be greater than 0",
        ),
        (["--target", "http://h:1", "--model", "m", "--duration", "-2"], "--duration = -2.0"),
        (["--target", "http://h:1", "--arrival", "trace", "--model", "m"], "needs trace"),
        (
            ["--target", "http://h:1", "--model", "m", "--mode", "closed", "--rate-range", "1:2"],
            "need --mode open",
        ),
        (["--target", "http://h:1", "--model", "m", "--rate-range", "5:1"], "bad range '5:1'"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(capsys, args, needle) -> None:
    rc, out, err = run(capsys, *args)
    assert rc == 2
    assert needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_unreachable_target_exits_1(capsys) -> None:
    port = free_port()
    rc, _, err = run(
        capsys, "--target", f"grpc://127.0.0.1:{port}", "--model", "m", "--duration", "1"
    )
    assert rc == 1
    assert err.startswith(f"headrace load: error: cannot reach grpc://127.0.0.1:{port}")


def test_malformed_trace_names_the_line(capsys, tmp_path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("HashOwner,HashApp,HashFunction,Trigger,1,2\no,a,f,http,1,2\no,a,g,http,1\n")
    rc, _, err = run(
        capsys,
        "--target",
        "http://127.0.0.1:9",
        "--arrival",
        "trace",
        "--trace",
        str(p),
        "--model",
        "m",
    )
    assert rc == 2
    assert "t.csv:3: expected 6 columns, got 5" in err


def test_help_teaches(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["load", "--help"])
    out = capsys.readouterr().out
    for phrase in ("coordinated", "--slo-ms", "--find-max-rate", "examples:", "timeout"):
        assert phrase in out


def test_full_run_writes_compact_report_json_csv_and_plots(capsys, server, tmp_path) -> None:
    rc, out, _ = run(
        capsys, "--target", server, "--model", "echo", "--rate", "150", "--duration", "1",
        "--warmup", "0.2", "--arrival", "gamma", "--cv", "2", "--slo-ms", "500", "--quiet",
        "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv"),
        "--plot", str(tmp_path / "plots" / "r"), "--lag-warn-ms", "1000",
    )  # fmt: skip
    assert rc == 0
    s = json.loads((tmp_path / "r.json").read_text())
    assert s["offered"] > 50 and s["ok"] == s["offered"]
    assert f"attainment {100 * s['attainment']:.2f}% within 500 ms" in out
    assert "goodput" in out and "p99" in out and "rejected 0" in out
    assert s["per_variant"][0]["variant"] == "small"
    # the run record: enough to rebuild the run
    assert s["run"]["spec"]["cv"] == 2.0 and s["run"]["spec"]["arrival"] == "gamma"
    assert s["run"]["spec"]["seed"] == 0 and s["run"]["spec"]["warmup_s"] == 0.2
    assert s["run"]["host"]["cpu_count"] and s["run"]["headrace"]["version"]
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert int(rows[0]["OK"]) == s["ok"]
    assert int(rows[0]["p99 latency"]) == round(s["latency_ms"]["p99"] * 1000)
    for name in ("r_cdf.png", "r_timeline.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 1000


def test_rate_range_writes_one_row_per_rate(capsys, server, tmp_path) -> None:
    rc, _, _ = run(
        capsys, "--target", server, "--model", "echo", "--rate-range", "40:80:40",
        "--duration", "0.5", "--warmup", "0.1", "--quiet", "--csv", str(tmp_path / "s.csv"),
    )  # fmt: skip
    assert rc == 0
    rows = list(csv.DictReader((tmp_path / "s.csv").open()))
    assert [float(r["Request Rate"]) for r in rows] == [40.0, 80.0]


def test_max_rate_search_writes_reasons_rate_verdicts_and_a_plot(capsys, server, tmp_path) -> None:
    rc, out, _ = run(
        capsys, "--target", server, "--model", "echo", "--slo-ms", "500", "--find-max-rate",
        "--search-range", "40:80", "--trials", "1", "--window", "0.2", "--warmup", "0.1",
        "--quiet", "--json", str(tmp_path / "k.json"), "--plot", str(tmp_path / "k"),
        "--lag-warn-ms", "1000",
    )  # fmt: skip
    assert rc == 0
    assert "highest rate holding 99.00% attainment in most of 1 trials: 80.0/s" in out
    doc = json.loads((tmp_path / "k.json").read_text())
    assert doc["best_rate"] == 80.0 and doc["target_attainment"] == 0.99
    assert [r["rate"] for r in doc["rates"]] == [40.0, 80.0]
    assert all(r["passed"] and r["reason"] == "1/1 trials passed" for r in doc["rates"])
    assert all(t["passed"] and t["reason"] == "ok" and t["trial"] == 1 for t in doc["trials"])
    assert (tmp_path / "k_sweep.png").stat().st_size > 1000


def test_rate_sweep_honours_plot(capsys, server, tmp_path) -> None:
    rc, _, _ = run(
        capsys, "--target", server, "--model", "echo", "--rate-range", "40:80:40",
        "--duration", "0.3", "--warmup", "0.1", "--quiet", "--plot", str(tmp_path / "s"),
    )  # fmt: skip
    assert rc == 0
    assert (tmp_path / "s_sweep.png").stat().st_size > 1000


def test_a_search_without_an_slo_is_refused(capsys) -> None:
    rc, _, err = run(capsys, "--target", "http://h:1", "--model", "m", "--find-max-rate")
    assert rc == 2 and "--find-max-rate needs --slo-ms" in err


def test_a_run_without_an_slo_reports_attainment_na(capsys, server, tmp_path) -> None:
    rc, out, _ = run(
        capsys, "--target", server, "--model", "echo", "--rate", "100", "--duration", "0.3",
        "--warmup", "0.1", "--quiet", "--json", str(tmp_path / "n.json"), "--lag-warn-ms", "1000",
    )  # fmt: skip
    assert rc == 0
    assert "attainment n/a (no SLO)" in out and "100.00%" not in out
    s = json.loads((tmp_path / "n.json").read_text())
    assert s["attainment"] is None and s["ok"] == s["offered"] > 0
    assert all(w["attainment"] is None for w in s["timeline"])
