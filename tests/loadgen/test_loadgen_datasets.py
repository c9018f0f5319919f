"""Payloads from a data set: an --input-dir of .npy / .npz files, one request each, and the
digits family's held-out split, sent in turn; one fixed payload per model stays the default."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from loadgen.payload import PayloadError, read_input_dir
from loadgen.run import run_load
from loadgen.spec import InputSpec, LoadSpec
from loadgen.testserver import MODEL, Behaviour, serve
from profiles.triton.server import free_port

N = 24  # requests measured, one connection: the server sees them in send order


def bodies(scheme: str, **spec: object) -> list[bytes]:
    async def go() -> list[bytes]:
        seen: list[bytes] = []
        hp, gp = free_port(), free_port()
        stop = await serve(Behaviour(seen=seen), hp, gp)
        try:
            port = hp if scheme == "http" else gp
            await run_load(LoadSpec(target=f"{scheme}://127.0.0.1:{port}", model=MODEL, rate=200,
                                    arrival="constant", requests=N, warmup_s=0.0, connections=1,
                                    lag_warn_ms=1000, **spec))  # fmt: skip
        finally:
            await stop()
        return seen

    return asyncio.run(go())


def which(body: bytes, arrays: list[np.ndarray]) -> int:
    """The index of the one payload whose raw bytes the body carries."""
    hits = [i for i, a in enumerate(arrays) if a.astype("<f4").tobytes() in body]
    assert len(hits) == 1, hits
    return hits[0]


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_input_dir_files_are_sent_in_turn_in_file_name_order(tmp_path, scheme) -> None:
    samples = [np.full(4, k + 0.25, dtype=np.float32) for k in range(3)]
    for k in (2, 0, 1):  # written out of order: the order is the files' names
        np.save(tmp_path / f"req-{k}.npy", samples[k])
    seen = bodies(scheme, input_dir=tmp_path)
    assert len(seen) == N
    assert [which(b, samples) for b in seen] == [k % 3 for k in range(N)]


def test_the_digits_test_split_is_sent_row_by_row() -> None:
    from profiles.digits.family import VARIANTS, dataset

    _, x_test, _, _ = dataset(VARIANTS["digits-small"])
    seen = bodies("grpc", dataset="digits", batch=2)
    assert seen == [x_test[2 * k : 2 * k + 2].astype("<f4").tobytes() for k in range(N)]


def test_one_fixed_payload_per_model_is_the_default() -> None:
    seen = bodies("grpc")
    assert len(set(seen)) == 1 and len(seen) == N


def test_npz_files_name_their_inputs_and_get_a_batch_dimension(tmp_path) -> None:
    np.savez(tmp_path / "a.npz", x=np.zeros(3, dtype=np.int64), y=np.ones((1, 2), dtype=np.float16))
    inputs = (InputSpec(name="x", shape=(-1, 3), datatype="INT64"),
              InputSpec(name="y", shape=(-1, 2), datatype="FP16"))  # fmt: skip
    (req,) = read_input_dir(tmp_path, inputs)
    got = {t.name: (t.datatype, t.shape) for t in req}
    assert got == {"x": ("INT64", [1, 3]), "y": ("FP16", [1, 2])}
    with pytest.raises(PayloadError, match=r"holds \['x', 'y'\], the model's inputs are \['z'\]"):
        read_input_dir(tmp_path, (InputSpec(name="z", shape=(3,)),))
    np.save(tmp_path / "b.npy", np.zeros(3))
    with pytest.raises(PayloadError, match="a .npy file holds one input, but the model has 2"):
        read_input_dir(tmp_path, inputs)
    with pytest.raises(PayloadError, match="is not a directory"):
        read_input_dir(tmp_path / "missing", inputs)
    (tmp_path / "empty").mkdir()
    with pytest.raises(PayloadError, match="no .npy or .npz files"):
        read_input_dir(tmp_path / "empty", inputs)
