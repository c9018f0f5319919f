"""Which trace functions replay onto which models: every function in file order (AlpaServe's
round-robin), or the top-N by invocations, or a seeded sample, dealt onto the models by rank
of invocation count, the busiest first; ``headrace sim`` and ``headrace load`` print the
mapping."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from deploy.cli import main as headrace
from loadgen.arrivals import AzureFunction, AzureReplay
from loadgen.report import trace_mapping
from loadgen.spec import LoadSpec

TOTALS = [5, 400, 30, 400, 9_000, 0, 77, 1_200]  # invocations per function over the trace


def functions(minutes: int = 4) -> tuple[AzureFunction, ...]:
    out = []
    for k, total in enumerate(TOTALS):
        counts = np.full(minutes, total // minutes, dtype=np.int64)
        counts[0] += total - counts.sum()
        out.append(AzureFunction("o", "a", f"f{k}", "http", counts))
    return tuple(out)


def test_by_default_every_function_replays_dealt_in_file_order() -> None:
    r = AzureReplay(functions(), ("a", "b", "c"))
    assert [f.function for f in r.chosen()] == [f"f{k}" for k in range(8)]
    assert r.model_of() == {"f0": "a", "f1": "b", "f2": "c", "f3": "a", "f4": "b", "f5": "c", "f6": "a", "f7": "b"}


def test_top_n_replays_the_busiest_functions_dealt_by_rank() -> None:
    r = AzureReplay(functions(), ("a", "b"), top=4)
    # NOTE: most invoked first; a tie (f1, f3 at 400) in file order
    assert r.table() == [(1, "f4", 9_000, "a"), (2, "f7", 1_200, "b"), (3, "f1", 400, "a"), (4, "f3", 400, "b")]
    s = r.schedule(np.random.default_rng(1))
    assert set(s.models) == {"a", "b"}
    # only the chosen functions' invocations replay (Poisson within each minute)
    assert len(s) == pytest.approx(9_000 + 1_200 + 400 + 400, rel=0.05)
    a = int(np.sum(s.model_idx == s.models.index("a")))
    assert a == pytest.approx(9_400, rel=0.05)


def test_a_sample_is_seeded_and_ranked_and_a_top_beyond_the_file_is_the_file() -> None:
    one = AzureReplay(functions(), ("a", "b"), sample=3, seed=11)
    assert one.table() == AzureReplay(functions(), ("a", "b"), sample=3, seed=11).table()
    picks = {tuple(f.function for f in AzureReplay(functions(), ("a",), sample=3, seed=s).chosen()) for s in range(20)}
    assert len(picks) > 3  # the seed draws
    ranks = [n for _, _, n, _ in one.table()]
    assert ranks == sorted(ranks, reverse=True) and len(ranks) == 3
    assert len(AzureReplay(functions(), ("a",), top=50).chosen()) == 8
    with pytest.raises(ValueError, match="not both"):
        AzureReplay(functions(), ("a",), top=2, sample=2).chosen()


def test_ranks_count_the_minutes_replayed() -> None:
    funcs = functions()
    late = AzureFunction("o", "a", "late", "http", np.array([0, 0, 0, 50_000]))
    r = AzureReplay((*funcs, late), ("a",), top=1, minutes=3)
    assert r.table()[0][1] == "f4"  # its 50,000 come after the replayed minutes
    assert AzureReplay((*funcs, late), ("a",), top=1).table()[0][1] == "late"


def test_the_printed_mapping_names_each_function_and_each_models_share() -> None:
    lines = trace_mapping(AzureReplay(functions(), ("a", "b"), top=3).table(), shown=2)
    assert lines[0] == "trace mapping: 3 functions, 10,600 invocations in the minutes replayed"
    assert lines[1].startswith("  #1") and "f4" in lines[1] and "9,000" in lines[1] and lines[1].endswith("-> a")
    assert lines[3] == "  ... 1 more"
    assert lines[4:] == ["  a: 2 functions, 9,400 invocations (88.7%)", "  b: 1 functions, 1,200 invocations (11.3%)"]


def test_spec_fields_need_a_trace_and_one_choice(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="trace_top and trace_sample need arrival 'trace'"):
        LoadSpec(target="http://127.0.0.1:9", model="m", trace_top=3)
    with pytest.raises(ValueError, match="choose one"):
        LoadSpec(target="http://127.0.0.1:9", model="m", arrival="trace", trace=tmp_path / "t.csv", trace_top=1, trace_sample=1)


def write_trace(path: Path) -> Path:
    rows = ["HashOwner,HashApp,HashFunction,Trigger,1,2,3,4"]
    rows += [f"o,a,{f.function},http,{','.join(str(int(c)) for c in f.counts)}" for f in functions()]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_headrace_sim_prints_the_mapping_it_replays(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import loadgen.arrivals as arrivals

    reads: list[str] = []
    read = arrivals.read_azure_trace
    monkeypatch.setattr(arrivals, "read_azure_trace", lambda path: (reads.append(str(path)), read(path))[1])
    doc = {"models": [{"name": m, "slo_ms": 100, "max_batch": 16, "replicas": [
        {"url": f"127.0.0.1:{9000 + k}", "variant": "resnet50", "id": f"{m}-r0",
         "profile": "resnet50@A100-80GB/1g.10gb"}]} for k, m in enumerate(("a", "b"))]}
    (tmp_path / "gw.yaml").write_text(yaml.safe_dump(doc))
    rc = headrace(["sim", "-f", str(tmp_path / "gw.yaml"), "--arrival", "trace", "--trace",
                   str(write_trace(tmp_path / "t.csv")), "--trace-models", "a,b", "--trace-top", "2",
                   "--time-scale", "600", "--duration", "0.4", "--warmup", "0"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "trace mapping: 2 functions, 10,200 invocations" in err
    assert "  a: 1 functions, 9,000 invocations (88.2%)" in err and "  b: 1 functions, 1,200" in err
    assert reads == [str(tmp_path / "t.csv")]  # printed and replayed from one read of the file
    assert headrace(["sim", "-f", str(tmp_path / "gw.yaml"), "--trace-top", "2"]) == 2
    assert "trace_top and trace_sample need arrival 'trace'" in capsys.readouterr().err
