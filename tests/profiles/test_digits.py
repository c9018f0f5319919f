"""The digits family: real trained variants, served by real Triton with the same numbers."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from profiles.digits.family import (
    MEASURED_DIR,
    VARIANTS,
    DigitsVariant,
    DigitsWeights,
    dataset,
    forward,
    load_or_train,
    train,
    write_digits_models,
)
from profiles.profile import ProfileSet
from profiles.triton.server import TritonServer

SIZE_ORDER = ["digits-small", "digits-medium", "digits-large"]


def test_variants_are_ordered_by_cost_and_accuracy_is_measured():
    params = []
    accs = []
    for name in SIZE_ORDER:
        w = load_or_train(name)
        params.append(sum(W.size + b.size for W, b in w.layers))  # multiply-adds per row, + biases
        accs.append(w.accuracy)
        assert w.test_rows > 0
    # NOTE: variants listed small to large really grow, and bigger is at least as accurate
    assert params == sorted(params) and len(set(params)) == len(params)
    assert accs == sorted(accs), dict(zip(SIZE_ORDER, accs, strict=True))
    assert accs[0] > 0.5  # far above chance (0.1): the models learned something
    assert set(SIZE_ORDER) <= set(VARIANTS)


def test_accuracy_is_held_out_and_reproducible(tmp_path):
    v = DigitsVariant("digits-t", hidden=(8,), max_iter=60)
    w1, w2 = train(v), train(v)
    # NOTE: fixed seed -> identical weights; accuracy recomputed from the forward pass
    for (a, b), (c, d) in zip(w1.layers, w2.layers, strict=True):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, d)
    _, x_te, _, y_te = dataset(v)
    assert w1.test_rows == len(y_te)
    assert w1.accuracy == pytest.approx(float((forward(w1, x_te).argmax(1) == y_te).mean()))


def test_cache_roundtrip_and_key_tracks_hyperparameters(tmp_path):
    v = DigitsVariant("digits-t", hidden=(4,), max_iter=20)
    w = load_or_train(v, tmp_path)
    files = list(tmp_path.glob("*.npz"))
    assert len(files) == 1
    again = DigitsWeights.from_npz(files[0])
    assert again.accuracy == w.accuracy and again.variant == w.variant
    x = np.random.default_rng(0).random((5, 64), dtype=np.float32)
    np.testing.assert_array_equal(forward(again, x), forward(w, x))
    assert DigitsVariant("digits-t", hidden=(4,), max_iter=21).cache_key() != v.cache_key()


def test_forward_gives_probabilities_and_rejects_bad_shape():
    w = load_or_train("digits-small")
    p = forward(w, np.zeros((3, 64), np.float32))
    assert p.shape == (3, 10) and p.dtype == np.float32
    np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-5)
    with pytest.raises(ValueError, match=r"\[n, 64\].*\[3, 63\]"):
        forward(w, np.zeros((3, 63), np.float32))


def test_unknown_variant_lists_known(tmp_path):
    with pytest.raises(ValueError, match="digits-huge.*known.*digits-large"):
        write_digits_models(tmp_path, ["digits-huge"])


@pytest.mark.integration
def test_triton_serves_the_same_predictions_as_numpy(tmp_path):
    accs = write_digits_models(tmp_path / "repo", SIZE_ORDER, max_batch=32)
    _, x_te, _, y_te = dataset(VARIANTS["digits-small"])
    x = x_te[:96]
    with TritonServer(tmp_path / "repo") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        for name in SIZE_ORDER:
            w = load_or_train(name)
            got = []
            for start in range(0, len(x), 32):  # rows cross the wire in max-size batches
                chunk = x[start:start + 32]
                inp = httpclient.InferInput("INPUT0", list(chunk.shape), "FP32")
                inp.set_data_from_numpy(chunk)
                got.append(client.infer(name, [inp]).as_numpy("PROBS"))
            probs = np.concatenate(got)
            np.testing.assert_allclose(probs, forward(w, x), rtol=1e-5, atol=1e-6)
            assert accs[name] == w.accuracy
            # served accuracy on these rows agrees with the measured held-out accuracy
            served = float((probs.argmax(1) == y_te[:96]).mean())
            assert abs(served - w.accuracy) < 0.15


def test_committed_measured_profiles_load_with_labels_and_accuracy():
    profiles = ProfileSet.load(MEASURED_DIR)
    found = {p.variant: p for p in profiles.find(model="digits")}
    assert set(SIZE_ORDER) <= set(found)
    for name in SIZE_ORDER:
        p = found[name]
        # the files say slice "cpu"; a ProfileSet keys a host's one device as the whole slice
        assert (p.gpu, p.slice, p.provenance.kind) == ("cpu", "gpu", "measured")
        # NOTE: recorded accuracy is the held-out accuracy the weights reproduce. Training is
        # seeded, but BLAS kernels differ by CPU, so weights trained on another host may answer
        # one or two of the held-out digits differently: at most two samples apart
        w = load_or_train(name)
        assert abs(p.accuracy - w.accuracy) <= 2 / w.test_rows + 1e-4, (name, p.accuracy, w.accuracy)
        lat = [p.latency(b, "p50") for b in range(1, p.max_batch + 1)]
        assert lat == sorted(lat)  # usable by "largest batch within budget"
