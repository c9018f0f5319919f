"""The "digits" model family: small real classifiers with a real accuracy/cost trade-off.

Each variant is trained at set-up time on scikit-learn's bundled ``load_digits`` (1797 8x8
grey images, nothing downloaded), with a fixed seed and a stratified held-out split; its
accuracy is measured on that held-out part. Weights are cached as ``.npz`` files keyed by
the variant's hyperparameters, so retraining happens once per machine (a few seconds).

Input contract (what clients send as ``INPUT0``): FP32 ``[64]`` per row, the 8x8 image in
row-major order with pixel intensities 0..16 divided by 16, i.e. values in [0, 1].
Output ``PROBS``: FP32 ``[10]`` class probabilities (softmax), row-aligned with the input.

The forward pass (:func:`forward`) is numpy only; it is the one used both here and inside
Triton's python backend (``profiles/digits/triton_model.py``).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from profiles.triton.repository import (
    HEADRACE_ROOT,
    DynamicBatching,
    ModelConfig,
    TensorSpec,
    write_model,
)

FAMILY = "digits"
INPUT = TensorSpec("INPUT0", "FP32", (64,))
OUTPUT = TensorSpec("PROBS", "FP32", (10,))
MODEL_PY = Path(__file__).with_name("triton_model.py")
# weights cache; HEADRACE_DIGITS_CACHE overrides (e.g. for an installed, read-only package)
DEFAULT_CACHE = Path(os.environ.get("HEADRACE_DIGITS_CACHE", HEADRACE_ROOT / ".headrace" / "digits"))


@dataclass(frozen=True)
class DigitsVariant:
    """Hyperparameters of one variant; together with the seed they key its cached weights."""

    name: str
    hidden: tuple[int, ...]  # hidden ReLU layer widths; () is softmax regression
    pool: bool = False  # train on 2x2-averaged pixels (16 features); folded into layer 0
    max_iter: int = 300
    alpha: float = 1e-4  # L2 penalty
    test_fraction: float = 0.3
    seed: int = 0

    def cache_key(self) -> str:
        blob = json.dumps({**asdict(self), "format": 2}, sort_keys=True).encode()
        return f"{self.name}-{hashlib.sha256(blob).hexdigest()[:12]}"


VARIANTS: dict[str, DigitsVariant] = {
    v.name: v
    for v in (
        DigitsVariant("digits-small", hidden=(), pool=True),  # 2x2-pooled pixels (16) -> 10
        DigitsVariant("digits-medium", hidden=(32,)),  # 64 -> 32 -> 10
        DigitsVariant("digits-large", hidden=(256, 256)),  # 64 -> 256 -> 256 -> 10
    )
}


@dataclass(frozen=True)
class DigitsWeights:
    variant: str
    layers: tuple[tuple[np.ndarray, np.ndarray], ...]  # (W [in, out], b [out]) per layer
    accuracy: float  # on the held-out split
    test_rows: int

    def to_npz(self) -> bytes:
        arrays: dict[str, np.ndarray] = {
            "meta": np.frombuffer(json.dumps({
                "variant": self.variant, "accuracy": self.accuracy,
                "test_rows": self.test_rows, "layers": len(self.layers),
            }).encode(), dtype=np.uint8),
        }
        for i, (w, b) in enumerate(self.layers):
            arrays[f"W{i}"], arrays[f"b{i}"] = w, b
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    @classmethod
    def from_npz(cls, data: bytes | Path) -> DigitsWeights:
        src = io.BytesIO(data) if isinstance(data, bytes) else data
        with np.load(src) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            layers = tuple(
                (z[f"W{i}"].astype(np.float32), z[f"b{i}"].astype(np.float32)) for i in range(meta["layers"])
            )
        return cls(meta["variant"], layers, float(meta["accuracy"]), int(meta["test_rows"]))


def pool_matrix() -> np.ndarray:
    """[64, 16] matrix averaging the 2x2 blocks of an 8x8 image given as a row of 64."""
    m = np.zeros((64, 16), np.float32)
    for r in range(8):
        for c in range(8):
            m[r * 8 + c, (r // 2) * 4 + c // 2] = 0.25
    return m


def forward(weights: DigitsWeights, x: np.ndarray) -> np.ndarray:
    """Class probabilities [n, 10] (float32) for rows ``x`` [n, 64] in [0, 1]."""
    h = np.asarray(x, dtype=np.float32)
    if h.ndim != 2 or h.shape[1] != 64:
        raise ValueError(f"{weights.variant}: input must be [n, 64], got {list(h.shape)}")
    for i, (w, b) in enumerate(weights.layers):
        h = h @ w + b
        if i < len(weights.layers) - 1:
            h = np.maximum(h, 0.0)
    h = h - h.max(axis=1, keepdims=True)
    e = np.exp(h)
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def dataset(variant: DigitsVariant) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, x_test, y_train, y_test): scaled to [0, 1], stratified split by ``seed``."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    return train_test_split(x, y, test_size=variant.test_fraction, random_state=variant.seed, stratify=y)


def train(variant: DigitsVariant) -> DigitsWeights:
    """Fit ``variant`` (seeded, deterministic) and measure its held-out accuracy."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    x_tr, x_te, y_tr, y_te = dataset(variant)
    pool = pool_matrix()
    prep = (lambda a: a @ pool) if variant.pool else (lambda a: a)
    clf = MLPClassifier(hidden_layer_sizes=variant.hidden, max_iter=variant.max_iter,
                        alpha=variant.alpha, random_state=variant.seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(prep(x_tr), y_tr)
    if list(clf.classes_) != list(range(10)):
        raise RuntimeError(f"{variant.name}: expected classes 0..9, got {list(clf.classes_)}")
    ws = [w.astype(np.float32) for w in clf.coefs_]
    if variant.pool:  # pooling is linear: fold it into the first layer (64 inputs, one matmul)
        ws[0] = pool @ ws[0]
    layers = tuple((w, b.astype(np.float32)) for w, b in zip(ws, clf.intercepts_, strict=True))
    # accuracy is measured with the same forward pass that serves, not sklearn's predict
    probe = DigitsWeights(variant.name, layers, 0.0, len(y_te))
    acc = float((forward(probe, x_te).argmax(axis=1) == y_te).mean())
    return DigitsWeights(variant.name, layers, acc, len(y_te))


def resolve(variants: list[str] | tuple[str, ...] | None) -> list[DigitsVariant]:
    names = list(variants) if variants is not None else list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown digits variant(s) {unknown}; known: {sorted(VARIANTS)}")
    return [VARIANTS[n] for n in names]


def load_or_train(variant: DigitsVariant | str, cache_dir: str | Path | None = None) -> DigitsWeights:
    """Weights of ``variant`` from the cache, training and caching them if missing."""
    v = resolve([variant])[0] if isinstance(variant, str) else variant
    path = Path(cache_dir or DEFAULT_CACHE) / f"{v.cache_key()}.npz"
    if path.exists():
        try:
            return DigitsWeights.from_npz(path)
        except (OSError, ValueError, KeyError):
            pass  # a corrupt cache entry is simply retrained
    weights = train(v)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(weights.to_npz())
    tmp.replace(path)  # atomic: concurrent trainers never see half a file
    return weights


def write_digits_models(
    repo: str | Path,
    variants: list[str] | tuple[str, ...] | None = None,
    *,
    cache_dir: str | Path | None = None,
    max_batch: int = 64,
    instance_count: int = 1,
    dynamic_batching: DynamicBatching | None = None,
) -> dict[str, float]:
    """Write one Triton python-backend model per variant (named after it) into ``repo``;
    returns each variant's held-out accuracy."""
    if not 1 <= max_batch <= 4096:
        raise ValueError(f"max_batch ({max_batch}) must be in [1, 4096]")
    if instance_count < 1:
        raise ValueError(f"instance_count ({instance_count}) must be >= 1")
    out: dict[str, float] = {}
    for v in resolve(variants):
        weights = load_or_train(v, cache_dir)
        config = ModelConfig(
            name=v.name, inputs=(INPUT,), outputs=(OUTPUT,), max_batch_size=max_batch,
            instance_count=instance_count, dynamic_batching=dynamic_batching,
            parameters={"headrace_root": str(HEADRACE_ROOT), "weights_file": "weights.npz",
                        "accuracy": f"{weights.accuracy:.6f}"},
        )
        write_model(Path(repo), config, MODEL_PY, files={"weights.npz": weights.to_npz()})
        out[v.name] = weights.accuracy
    return out


MEASURED_DIR = HEADRACE_ROOT / "profiles" / "measured"


def measure_profiles(out_dir: str | Path = MEASURED_DIR, variants: list[str] | None = None, *,
                     samples: int = 60, max_batch: int = 64, cache_dir: str | Path | None = None,
                     log=None) -> list[Path]:
    """Serve the variants in a private tritonserver on this CPU, profile each over HTTP and
    write ``<out_dir>/<variant>.yaml`` (gpu and slice ``cpu``, held-out accuracy recorded)."""
    import tempfile

    from profiles.profiler import default_batches, profile_model
    from profiles.triton.server import TritonServer

    out_dir = Path(out_dir)
    written = []
    with tempfile.TemporaryDirectory(prefix="headrace-digits-") as tmp:
        accs = write_digits_models(Path(tmp) / "repo", variants, cache_dir=cache_dir, max_batch=max_batch)
        with TritonServer(Path(tmp) / "repo") as server:
            for name, acc in accs.items():
                path = out_dir / f"{name}.yaml"
                profile_model(out=path, log=log, url=f"http://{server.http_url}", model=name,
                              batches=default_batches(max_batch), concurrency=[1, 4], samples=samples, warmup=20,
                              family=FAMILY, accuracy=round(acc, 4), gpu="cpu", slice="cpu")
                written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m profiles.digits.family",
                                description="Train the digits variants; optionally profile them on this CPU.")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated variant names")
    p.add_argument("--measure", action="store_true", help=f"profile them in Triton and write {MEASURED_DIR}")
    p.add_argument("--out", default=str(MEASURED_DIR), help="directory for measured profiles")
    p.add_argument("--samples", type=int, default=60, help="timed requests per batch size")
    args = p.parse_args(argv)
    try:
        names = [v.name for v in resolve([x for x in args.variants.split(",") if x])]
        for n in names:
            print(f"{n}: held-out accuracy {load_or_train(n).accuracy:.4f}")
        if args.measure:
            for path in measure_profiles(args.out, names, samples=args.samples,
                                         log=lambda s: print(s, file=sys.stderr)):
                print(f"wrote {path}")
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
