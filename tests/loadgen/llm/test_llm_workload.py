"""Generative workloads: the Azure LLM 2023 and Mooncake trace formats (small files written here,
and the shared traces themselves), windows, time compression and context caps, Mooncake prompts
that share exactly the blocks their hash ids share, and synthetic arrivals with length
distributions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from loadgen.arrivals import TraceError
from loadgen.llm.workload import (
    BLOCK_TOKENS,
    FIRST_ID,
    Workload,
    cap_context,
    parse_length,
    read_azure_llm,
    read_mooncake,
    read_trace,
    synthetic,
    window,
)
from profiles.llm.tokens import encode

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.5000000,20,7
"""


def mooncake_lines(*rows: tuple[int, int, int, list[int]]) -> str:
    return "".join(json.dumps({"timestamp": t, "input_length": n, "output_length": o, "hash_ids": h}) + "\n"
                   for t, n, o, h in rows)


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_azure_llm_rows_are_times_from_the_first_request_and_lengths(tmp_path: Path) -> None:
    rows = read_azure_llm(write(tmp_path, "a.csv", AZURE))
    assert rows.times.tolist() == pytest.approx([0.0, 4.314579, 4.819410])
    assert rows.input_len.tolist() == [374, 396, 20]
    assert rows.output_len.tolist() == [44, 109, 7]
    assert rows.hash_ids == ()


@pytest.mark.parametrize(("text", "needle"), [
    ("TIME,ContextTokens,GeneratedTokens\n", "a.csv:1: header must be TIMESTAMP,ContextTokens,GeneratedTokens"),
    ("", "got 'an empty file'"),
    (AZURE + "2023-11-16 18:16:00,12\n", "a.csv:5: expected 3 columns, got 2"),
    (AZURE + "2023-11-16 18:16:00,twelve,3\n", "a.csv:5: ContextTokens 'twelve' is not an integer"),
    (AZURE + "2023-11-16 18:16:00,12,0\n", "a.csv:5: GeneratedTokens must be >= 1, got 0"),
    (AZURE + "yesterday,12,3\n", "a.csv:5: TIMESTAMP 'yesterday' is not a date and time"),
    (AZURE + "2023-11-16 18:00:00,12,3\n", "a.csv:5: timestamp is before the previous one"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests after the header"),
])
def test_a_bad_azure_llm_file_names_its_line(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(TraceError, match=None) as e:
        read_azure_llm(write(tmp_path, "a.csv", text))
    assert needle in str(e.value)


def test_mooncake_rows_keep_the_block_hash_ids(tmp_path: Path) -> None:
    rows = read_mooncake(write(tmp_path, "m.jsonl", mooncake_lines((0, 600, 5, [0, 1]), (1500, 512, 3, [0]))))
    assert rows.times.tolist() == [0.0, 1.5]
    assert rows.input_len.tolist() == [600, 512]
    assert rows.hash_ids == ((0, 1), (0,))


@pytest.mark.parametrize(("text", "needle"), [
    ("{not json\n", "m.jsonl:1: not JSON"),
    ('{"timestamp": 0}\n', "m.jsonl:1: want an object with timestamp, input_length, output_length, hash_ids"),
    (mooncake_lines((0, 600, 5, [0])), "m.jsonl:1: 1 hash_ids for input_length 600: want one per 512-token block (2)"),
    (mooncake_lines((0, 10, 5, [-1])), "m.jsonl:1: hash_ids must be a list of integers >= 0"),
    (mooncake_lines((0, 10, 0, [1])), "m.jsonl:1: output_length must be >= 1, got 0"),
    (mooncake_lines((5, 10, 1, [1]), (4, 10, 1, [2])), "m.jsonl:2: timestamp is before the previous one"),
    ("\n", "no requests"),
])
def test_a_bad_mooncake_file_names_its_line(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(TraceError) as e:
        read_mooncake(write(tmp_path, "m.jsonl", text))
    assert needle in str(e.value)


def test_a_missing_trace_file_says_which_folder_to_give(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such trace file .*--traces-dir"):
        read_trace("mooncake", tmp_path)


def test_mooncake_prompts_share_exactly_the_blocks_their_hash_ids_share(tmp_path: Path) -> None:
    rows = read_mooncake(write(tmp_path, "m.jsonl", mooncake_lines(
        (0, 1100, 5, [7, 8, 9]), (10, 1024, 5, [7, 8]), (20, 700, 5, [7, 3]), (30, 300, 5, [9]))))
    w = Workload("mooncake", rows, seed=1)
    p = [w.prompt(i) for i in range(4)]
    assert [len(x) for x in p] == [1100, 1024, 700, 300]  # the last block cut to input_length
    assert p[0][:1024] == p[1]  # NOTE: equal leading hash ids give equal leading tokens
    assert p[2][:BLOCK_TOKENS] == p[0][:BLOCK_TOKENS]
    assert p[2][BLOCK_TOKENS:] != p[0][BLOCK_TOKENS:700]  # a different second block
    assert p[3][:76] == p[0][2 * BLOCK_TOKENS:]  # a hash id is one block wherever it sits
    assert p == [Workload("mooncake", rows, seed=1).prompt(i) for i in range(4)]  # deterministic
    assert Workload("mooncake", rows, seed=2).prompt(0) != p[0]
    assert min(min(x) for x in p) >= FIRST_ID and max(max(x) for x in p) < w.vocab_size


def test_chat_text_keeps_one_token_per_id_and_the_shared_prefix(tmp_path: Path) -> None:
    rows = read_mooncake(write(tmp_path, "m.jsonl", mooncake_lines((0, 600, 5, [1, 2]), (1, 520, 5, [1, 4]))))
    w = Workload("mooncake", rows)
    a, b = (encode(w.prompt_text(i), w.vocab_size) for i in range(2))
    assert (len(a), len(b)) == (600, 520)
    assert a[:BLOCK_TOKENS] == b[:BLOCK_TOKENS]


def test_azure_prompts_are_distinct_seeded_ids_of_the_given_length(tmp_path: Path) -> None:
    w = Workload("azure-llm", read_azure_llm(write(tmp_path, "a.csv", AZURE)), seed=3)
    p = [w.prompt(i) for i in range(3)]
    assert [len(x) for x in p] == [374, 396, 20]
    assert p[0][:16] != p[1][:16]  # nothing shared between requests
    assert p == [Workload("azure-llm", w.rows, seed=3).prompt(i) for i in range(3)]


def test_a_window_compresses_time_and_takes_the_first_requests(tmp_path: Path) -> None:
    rows = read_mooncake(write(tmp_path, "m.jsonl", mooncake_lines(
        *((1000 * t, 10, 2, [t]) for t in range(10)))))
    w = window(rows, start_s=2.0, duration_s=2.0, rate_scale=2.0)  # trace seconds 2..6, twice as fast
    assert w.times.tolist() == [0.0, 0.5, 1.0, 1.5]
    assert w.hash_ids == ((2,), (3,), (4,), (5,))
    assert window(rows, start_s=1.5, requests=3).times.tolist() == [0.5, 1.5, 2.5]
    with pytest.raises(ValueError, match="no requests in the window starting 20 s into the trace"):
        window(rows, start_s=20.0, duration_s=1.0)


def test_a_context_cap_keeps_prompt_and_output_within_it(tmp_path: Path) -> None:
    rows = read_mooncake(write(tmp_path, "m.jsonl", mooncake_lines(
        (0, 1500, 400, [1, 2, 3]), (1, 100, 50, [4]), (2, 1000, 900, [5, 6]))))
    capped = cap_context(rows, 1024)
    assert capped.input_len.tolist() == [1023, 100, 1000]
    assert capped.output_len.tolist() == [1, 50, 24]
    assert capped.hash_ids == ((1, 2), (4,), (5, 6))
    assert len(Workload("mooncake", capped).prompt(0)) == 1023


def test_length_distributions_parse_and_draw_at_least_one_token() -> None:
    rng = np.random.default_rng(0)
    assert parse_length("64", "input", ".").sample(rng, 3).tolist() == [64, 64, 64]
    u = parse_length("uniform:5:9", "input", ".").sample(rng, 1000)
    assert u.min() >= 5 and u.max() <= 9
    ln = parse_length("lognormal:200:0.5", "output", ".").sample(rng, 4000)
    assert ln.min() >= 1 and 180 < np.median(ln) < 220
    for bad in ("uniform:9:5", "lognormal:x:1", "beta:1:2", "fixed:0", "lognormal:10:-1"):
        with pytest.raises(ValueError, match="bad length"):
            parse_length(bad, "input", ".")


def test_synthetic_arrivals_hold_their_rate_and_count() -> None:
    d = parse_length("fixed:32", "input", ".")
    rows = synthetic("poisson", 50.0, 1.0, 20.0, None, d, d, seed=4)
    assert 900 < len(rows) < 1100 and rows.times[-1] < 20.0
    assert len(synthetic("gamma", 5.0, 3.0, None, 40, d, d, seed=4)) == 40
    again = synthetic("poisson", 50.0, 1.0, 20.0, None, d, d, seed=4)
    assert again.times.tolist() == rows.times.tolist()


def test_the_shared_traces_parse_whole(traces_dir: Path) -> None:
    azure = read_trace("azure-llm", traces_dir)
    moon = read_trace("mooncake", traces_dir)
    assert len(azure) == 19366 and 3400 < azure.times[-1] < 3600
    assert len(moon) == 12031 and moon.hash_ids[0][0] == 0
    # the conversation trace reuses prefixes: many requests start with the same block
    firsts = [h[0] for h in moon.hash_ids]
    assert len(set(firsts)) < len(firsts) / 2
