"""docs/benchmarks.md states what bench/results says: its claims are rendered from the JSON."""

from __future__ import annotations

from bench.claims import claims, render, splice
from bench.claims_common import BEGIN, END, PAGE, RESULTS, load


def test_the_page_states_what_the_committed_results_say() -> None:
    page = PAGE.read_text()
    # NOTE: `python -m bench.claims` rewrites the generated part after a benchmark commits new results
    assert splice(page, render(load())) == page


def test_only_the_part_between_the_markers_is_generated() -> None:
    page = f"intro\n{BEGIN}\nold row\n{END}\noutro\n"
    assert splice(page, f"{BEGIN}\nnew row\n{END}\n") == f"intro\n{BEGIN}\nnew row\n{END}\noutro\n"


def test_every_claim_reads_results_that_are_committed() -> None:
    made = claims(load())
    assert made
    for c in made:
        assert c.figure and c.benches
        assert all((RESULTS / f"{b.partition('/')[0]}.json").is_file() for b in c.benches), c.what
