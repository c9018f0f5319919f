"""``headrace plan`` on a generated fleet: what it derives for copies of one family is what
deriving each copy on its own gives."""

from __future__ import annotations

from bench.fleet import generate
from placement.problem import load
from profiles.derive import with_derived
from profiles.schema import load_documents


def test_copies_of_a_family_get_the_profiles_deriving_each_would_give(tmp_path):
    paths = generate(models=6, gpus=5, seed=3).write(tmp_path)
    inv, demands, got = load([str(paths["pool"]), str(paths["models"])], [str(paths["profiles"])])
    docs = load_documents(paths["pool"], paths["models"])
    measured = got.__class__([p for p in got if p.provenance.kind != "derived"])
    variants = {p.variant for md in docs.deployments for p in measured.find(model=md.spec.model)}
    want = with_derived(measured, gpus=tuple(sorted({c.gpu for c in inv.classes})), variants=variants)
    # NOTE: every copy's profiles equal its own derivation, provenance (naming its source) included
    assert {p.key: p for p in got} == {p.key: p for p in want}
    assert len({d.model.rsplit("-", 1)[0] for d in demands}) < len(demands)  # some family is copied
