"""What makes ``headrace plan`` fast on a fleet keeps its answers: JSON profile files read as
their YAML twins, the capacity tables' one-pass curves and Poisson quantile equal the per-batch
predictor and scipy, and the plan of a generated fleet is the same whichever file it reads."""

from __future__ import annotations

import json

import pytest
import yaml

from bench.fleet import generate
from placement.problem import load
from placement.solve.capacity import poisson_quantile
from placement.solve.solver import solve
from profiles.derive import with_derived
from profiles.profile import ProfileError, ProfileSet, load_profiles, profile_to_dict, save_profiles
from profiles.sharing import mps_latencies, mps_latency

REFERENCE = ProfileSet.reference()


def test_poisson_quantile_is_scipys():
    from scipy.stats import poisson

    means = [0.2, 1.0, 3.5, *range(1, 600, 7), 1000.0, 2048.0, 4096.0]
    for q in (0.5, 0.99, 0.999, 0.9999):
        want = [int(x) for x in poisson.ppf(q, means)]
        assert [poisson_quantile(q, float(m)) for m in means] == want, q


@pytest.mark.parametrize(("q", "mean"), [(0.0, 1.0), (1.0, 1.0), (0.5, 0.0)])
def test_poisson_quantile_rejects_what_has_none(q, mean):
    with pytest.raises(ValueError, match="need 0 < q < 1 and mean > 0"):
        poisson_quantile(q, mean)


def test_latencies_in_one_pass_are_the_predictors():
    profiles = [p for p in with_derived(REFERENCE) if p.gpu != "cpu"][::7]
    assert len(profiles) > 20
    for p in profiles:
        solo = p.latencies(p.max_batch)
        # NOTE: equal to the last bit: the planner's tables and the batcher must agree exactly
        assert solo[1:] == [p.latency(b) for b in range(1, p.max_batch + 1)], p.name
        for share in (0.5, 0.125):
            shared = mps_latencies(p, p.max_batch, share)
            assert shared[1:] == [mps_latency(p, b, share, busy_neighbours=True)
                                  for b in range(1, p.max_batch + 1)], (p.name, share)
    with pytest.raises(ProfileError, match="exceeds max_batch"):
        profiles[0].latencies(profiles[0].max_batch + 1)


def test_a_json_profile_file_reads_as_its_yaml_twin(tmp_path):
    mine = [p for p in REFERENCE if p.model == "resnet50"][:4]
    save_profiles(tmp_path / "a.yaml", mine)
    save_profiles(tmp_path / "a.json", mine)
    assert load_profiles(tmp_path / "a.json") == load_profiles(tmp_path / "a.yaml") == mine
    # one document alone, and JSON text in a file not named .json (it is YAML too)
    (tmp_path / "one.json").write_text(json.dumps(profile_to_dict(mine[0])))
    (tmp_path / "list.yml").write_text(json.dumps([profile_to_dict(p) for p in mine]))
    assert load_profiles(tmp_path / "one.json") == mine[:1]
    assert load_profiles(tmp_path / "list.yml") == mine
    # a folder reads its .json files beside its .yaml ones
    folder = tmp_path / "folder"
    folder.mkdir()
    save_profiles(folder / "x.json", mine[:2])
    save_profiles(folder / "y.yaml", mine[2:])
    assert sorted(p.name for p in ProfileSet.load(folder)) == sorted(p.name for p in mine)


def test_copies_share_one_curve_once_read():
    p = next(iter(REFERENCE))
    docs = [profile_to_dict(p.renamed(f"m{i}", f"v{i}")) for i in range(3)]
    a, b, c = (load_profiles_text(json.dumps(docs)))
    assert a.points == p.points and a.points is b.points is c.points


def load_profiles_text(text: str, name: str = "p.json"):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_text(text)
        return load_profiles(path)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("bad.json", '[{"apiVersion": ', "bad.json: not valid JSON: line 1, column 17: Expecting value"),
    ("bad.json", "[1]", "bad.json document 0 item 0: expected a mapping, got int"),
    ("bad.json", '[{"kind": "Profile"}]', "bad.json document 0 item 0: spec: Field required"),
    ("bad.yaml", "[{a: 1}", "bad.yaml: not valid YAML:"),
])
def test_a_bad_profile_file_is_one_line(name, text, message):
    with pytest.raises(ProfileError) as e:
        load_profiles_text(text, name)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_renamed_is_the_copy_replace_would_make():
    from dataclasses import replace

    p = next(iter(REFERENCE))
    assert p.renamed("m", "v") == replace(p, model="m", variant="v")
    assert p.renamed("m", "v").points is p.points


def test_a_fleet_plans_the_same_from_json_profiles(tmp_path):
    fleet = generate(models=30, gpus=20, seed=5)
    plans = []
    for fmt in ("yaml", "json"):
        paths = fleet.write(tmp_path / fmt, fmt)
        assert paths["profiles"].name == f"profiles.{fmt}"
        inv, demands, profiles = load([str(paths["pool"]), str(paths["models"])], [str(paths["profiles"])])
        plan = solve(demands, profiles, inv, "greedy")
        plan.verify()
        plans.append(plan)
    assert plans[0].gpus == plans[1].gpus and plans[0].lower_bound == plans[1].lower_bound
    with pytest.raises(ValueError, match="unknown profile format 'toml'; known: yaml, json"):
        fleet.write(tmp_path / "x", "toml")


def test_yaml_anchors_merge_keys_and_tags_read_as_their_expansion():
    p = profile_to_dict(next(iter(REFERENCE)))
    plain = yaml.safe_dump([p, p], sort_keys=False)
    first = yaml.safe_dump(p, sort_keys=False).replace("\nspec:", "\nspec: &s").replace("\n", "\n  ")
    # the second takes the first's spec by a merge key, its max_batch and apiVersion by explicit tags
    anchored = (f"- {first}\n- apiVersion: !!str {p['apiVersion']}\n  kind: Profile\n"
                f"  metadata: {{name: {p['metadata']['name']}}}\n"
                f"  spec:\n    <<: *s\n    max_batch: !!int {p['spec']['max_batch']}\n")
    assert load_profiles_text(anchored, "a.yaml") == load_profiles_text(plain, "p.yaml")
