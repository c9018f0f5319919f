"""The profiler measures live Triton models and writes profiles in the reference format."""

from __future__ import annotations

import pytest

from deploy.cli import main as headrace
from profiles.digits.family import write_digits_models
from profiles.emulator import write_emulated_model
from profiles.profile import LatencyPoint, ProfileSet, load_profiles
from profiles.profiler import (
    ProfilerError,
    default_batches,
    monotone_points,
    parse_config,
    parse_int_list,
    profile_model,
)
from profiles.triton.server import TritonServer, free_port

BATCHES = [1, 2, 4, 8, 16, 32]


def reference_profile():
    return ProfileSet.reference().get("resnet50", "A100-80GB", "1g.10gb").with_max_batch(32)


def test_settings_errors_name_field_and_value():
    with pytest.raises(ProfilerError, match=r"samples.*got 2"):
        parse_config(url="x:1", model="m", samples=2)
    with pytest.raises(ProfilerError, match=r"batches.*\[0, 4\]"):
        parse_config(url="x:1", model="m", batches=[0, 4])
    with pytest.raises(ProfilerError, match=r"protocol.*'smtp'"):
        parse_config(url="x:1", model="m", protocol="smtp")
    with pytest.raises(ProfilerError, match=r"--batches.*'1,two'"):
        parse_int_list("1,two", "--batches")


def test_monotone_points_only_raise_dips():
    pts = [LatencyPoint(1, 0.010, 0.012), LatencyPoint(2, 0.009, 0.013), LatencyPoint(4, 0.020, 0.011)]
    out, raised = monotone_points(pts)
    # NOTE: latency never falls as the batch grows; untouched points stay exactly as measured
    assert [(p.p50, p.p99) for p in out] == [(0.010, 0.012), (0.010, 0.013), (0.020, 0.013)]
    assert raised == [2, 4]
    assert monotone_points(out) == (out, [])


def test_default_batches_double_up_to_the_model_max():
    assert default_batches(1) == [1]
    assert default_batches(32) == [1, 2, 4, 8, 16, 32]
    assert default_batches(48) == [1, 2, 4, 8, 16, 32, 48]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unreachable_server_is_a_clear_error(protocol):
    url = f"127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ProfilerError, match=f"cannot reach Triton at {url} over {protocol}"):
        profile_model(url=url, model="m", protocol=protocol, samples=5)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("profiler-repo")
    write_emulated_model(repo, "emulated", reference_profile(), slice_id="gpu0/1g.10gb@0")
    write_digits_models(repo, ["digits-small"], max_batch=16)
    with TritonServer(repo) as s:
        yield s


def _recovery_errors(server, samples: int, chunks: int) -> dict[int, float]:
    ref = reference_profile()
    res = profile_model(url=f"http://{server.http_url}", model="emulated", batches=BATCHES,
                        samples=samples, chunks=chunks, gpu="A100-80GB", slice="1g.10gb")
    got = {p.batch: p.p50 for p in res.profile.points}
    assert sorted(got) == BATCHES
    return {b: got[b] / ref.latency(b, "p50") - 1 for b in BATCHES}


@pytest.mark.integration
def test_recovers_an_emulated_profile(server):
    errors = _recovery_errors(server, samples=60, chunks=6)
    shown = {b: f"{e:+.1%}" for b, e in errors.items()}
    # NOTE: the emulated model ends batches early by Triton's own cost, so the latency a
    # client sees is the profile's p50 and the profiler recovers it. On a shared, overloaded
    # host single batch sizes can be delayed for a whole run, so the default suite asks for
    # 5% on the typical batch size and 20% on every one; the strict check below is opt-in.
    assert sorted(abs(e) for e in errors.values())[len(errors) // 2] <= 0.05, shown
    assert all(abs(e) <= 0.20 for e in errors.values()), shown


@pytest.mark.slow
@pytest.mark.integration
def test_recovers_an_emulated_profile_within_5_percent_at_every_batch(server):
    errors = _recovery_errors(server, samples=120, chunks=8)
    assert all(abs(e) <= 0.05 for e in errors.values()), {b: f"{e:+.1%}" for b, e in errors.items()}


@pytest.mark.integration
def test_grpc_profile_yaml_has_labels_and_provenance(server, tmp_path):
    out = tmp_path / "p.yaml"
    profile_model(out=out, url=server.grpc_url, protocol="grpc", model="emulated", batches=[1, 4],
                  samples=5, warmup=1, gpu="A100-80GB", slice="1g.10gb", variant="resnet50-emu")
    (p,) = load_profiles(out)
    assert (p.variant, p.gpu, p.slice, p.model) == ("resnet50-emu", "A100-80GB", "1g.10gb", "resnet50")
    assert p.provenance.kind == "measured" and p.provenance.measured_batches == (1, 4)
    assert server.grpc_url in p.provenance.source and "grpc" in p.provenance.source
    # a few samples over gRPC already land near the emulated profile
    assert p.latency(4, "p50") == pytest.approx(reference_profile().latency(4, "p50"), rel=0.25)


@pytest.mark.integration
def test_unknown_model_and_too_large_batch_are_clear_errors(server):
    with pytest.raises(ProfilerError, match=r"'nope' is not available.*digits-small.*emulated|emulated.*digits"):
        profile_model(url=server.http_url, model="nope", samples=5)
    with pytest.raises(ProfilerError, match=r"batch 64 exceeds the model's max_batch_size \(16\)"):
        profile_model(url=server.http_url, model="digits-small", batches=[1, 64], samples=5)


@pytest.mark.integration
def test_cli_profiles_a_real_digits_variant(server, tmp_path, capsys):
    out = tmp_path / "digits.yaml"
    code = headrace(["profile", "--url", f"http://{server.http_url}", "--model", "digits-small",
                     "--batches", "1,4,16", "--concurrency", "1,2", "--samples", "10", "--warmup", "2",
                     "--accuracy", "0.81", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    (p,) = load_profiles(out)
    assert (p.variant, p.model, p.gpu, p.slice, p.max_batch) == ("digits-small", "digits", "cpu", "cpu", 16)
    assert [pt.batch for pt in p.points] == [1, 4, 16] and p.accuracy == 0.81
    assert "concurrency 2" in p.provenance.notes
    assert "wrote" in capsys.readouterr().out


def test_cli_reports_unreachable_server_without_traceback(tmp_path, capsys):
    code = headrace(["profile", "--url", f"127.0.0.1:{free_port()}", "--model", "m",
                     "--out", str(tmp_path / "x.yaml")])
    assert code == 2
    assert "headrace profile: error: cannot reach Triton" in capsys.readouterr().err
    assert not (tmp_path / "x.yaml").exists()
