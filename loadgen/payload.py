"""Request bodies, built before the run: KServe v2 HTTP (JSON or binary tensors) and gRPC
``ModelInferRequest`` bytes, carrying Triton's ``timeout`` (µs) and ``priority`` parameters.

A model gets one fixed payload (synthesized from its metadata, ``--input`` or
``--input-file``), or a list the client sends in turn: one per file of an ``--input-dir``
(``.npy``: the model's only input; ``.npz``: inputs by name), or the rows of a data set
(``--dataset digits``: the held-out split the digits family is scored on).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.spec import DATATYPES, InputSpec


class PayloadError(ValueError):
    """Inputs cannot be built; the message says which and why."""


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str
    array: np.ndarray

    @property
    def shape(self) -> list[int]:
        return list(self.array.shape)

    def raw(self) -> bytes:
        if self.datatype == "BYTES":
            out = bytearray()
            for item in self.array.reshape(-1):
                b = item if isinstance(item, bytes) else str(item).encode()
                out += len(b).to_bytes(4, "little") + b
            return bytes(out)
        return np.ascontiguousarray(self.array).astype(self.array.dtype.newbyteorder("<")).tobytes()

    def json_data(self) -> list[Any]:
        flat = self.array.reshape(-1)
        if self.datatype == "BYTES":
            return [x.decode() if isinstance(x, bytes) else str(x) for x in flat]
        return flat.tolist()


@dataclass(frozen=True)
class HttpBody:
    path: str  # /v2/models/{m}/infer
    body: bytes
    headers: tuple[tuple[str, str], ...]


def synthesize(inputs: tuple[InputSpec, ...], batch: int, rng: np.random.Generator) -> list[Tensor]:
    out = []
    for spec in inputs:
        shape = tuple(batch if d == -1 else d for d in spec.shape)
        dt = spec.datatype
        if dt == "BYTES":
            arr = np.array([b"headrace"] * int(np.prod(shape)), dtype=object).reshape(shape)
        elif dt == "BOOL":
            arr = rng.random(shape) < 0.5
        elif dt.startswith("FP"):
            arr = rng.random(shape, dtype=np.float64).astype(DATATYPES[dt])
        else:
            arr = rng.integers(0, 100, size=shape).astype(DATATYPES[dt])
        out.append(Tensor(spec.name, dt, arr))
    return out


def inputs_from_metadata(meta: dict[str, Any], model: str) -> tuple[InputSpec, ...]:
    """``GET /v2/models/{m}`` metadata -> inputs to synthesize."""
    try:
        return tuple(
            InputSpec(name=i["name"], shape=tuple(i["shape"]), datatype=i["datatype"])
            for i in meta["inputs"]
        )
    except (KeyError, TypeError, ValueError) as e:
        raise PayloadError(f"model {model!r}: cannot read inputs from its metadata: {e}") from None


def read_input_file(path: Path) -> list[Tensor]:
    """Real inputs from a JSON file in v2 request form: ``{"inputs": [{name, shape, datatype,
    data}]}``."""
    try:
        doc = json.loads(Path(path).read_text())
        out = []
        for i in doc["inputs"]:
            dt = str(i["datatype"]).upper()
            if dt not in DATATYPES:
                raise ValueError(f"unknown datatype {dt!r}")
            data = i["data"]
            if dt == "BYTES":
                arr = np.array([str(x).encode() for x in np.ravel(data)], dtype=object)
            else:
                arr = np.asarray(data, dtype=DATATYPES[dt])
            out.append(Tensor(i["name"], dt, arr.reshape(tuple(i["shape"]))))
        return out
    except (OSError, KeyError, TypeError, ValueError) as e:
        raise PayloadError(f"{path}: bad input file ({type(e).__name__}: {e})") from None


NUMPY_DATATYPES = {np.dtype(v).str.lstrip("<>|="): k for k, v in DATATYPES.items() if k != "BYTES"}


def datatype_of(arr: np.ndarray, where: str) -> str:
    """The v2 datatype of a numpy array (object and byte strings are BYTES)."""
    if arr.dtype.kind in ("O", "S", "U"):
        return "BYTES"
    dt = NUMPY_DATATYPES.get(arr.dtype.str.lstrip("<>|="))
    if dt is None:
        raise PayloadError(f"{where}: dtype {arr.dtype} has no KServe v2 datatype")
    return dt


def _batched(arr: np.ndarray, spec: InputSpec | None) -> np.ndarray:
    """A sample without its batch dimension gets one, when the model's input has it."""
    if spec is not None and arr.ndim == len(spec.shape) - 1:
        return arr[None, ...]
    return arr


def read_input_dir(path: Path, inputs: tuple[InputSpec, ...] | None) -> list[list[Tensor]]:
    """One request per ``.npy`` / ``.npz`` file of ``path``, in file-name order. A ``.npy``
    holds the model's only input (its name from ``inputs``, the model's metadata); a
    ``.npz`` holds arrays named as the inputs. An array one dimension short of the input's
    shape is a single sample and gets a batch dimension of 1."""
    path = Path(path)
    if not path.is_dir():
        raise PayloadError(f"{path}: --input-dir is not a directory")
    files = sorted(f for f in path.iterdir() if f.suffix in (".npy", ".npz") and f.is_file())
    if not files:
        raise PayloadError(f"{path}: no .npy or .npz files")
    by_name = {i.name: i for i in inputs or ()}
    out = []
    for f in files:
        try:
            if f.suffix == ".npy":
                if len(by_name) != 1:
                    raise PayloadError(
                        f"{f}: a .npy file holds one input, but the model has "
                        f"{len(by_name)} ({', '.join(by_name) or 'unknown'}); use .npz files"
                    )
                (spec,) = by_name.values()
                arrays = {spec.name: np.load(f, allow_pickle=False)}
            else:
                with np.load(f, allow_pickle=False) as z:
                    arrays = {k: z[k] for k in z.files}
                if by_name and set(arrays) != set(by_name):
                    raise PayloadError(
                        f"{f}: holds {sorted(arrays)}, the model's inputs are {sorted(by_name)}"
                    )
        except (OSError, ValueError) as e:
            raise PayloadError(f"{f}: cannot read ({type(e).__name__}: {e})") from None
        out.append([
            Tensor(n, datatype_of(a, str(f)), _batched(a, by_name.get(n)))
            for n, a in arrays.items()
        ])  # fmt: skip
    return out


def digits_requests(inputs: tuple[InputSpec, ...] | None, batch: int) -> list[list[Tensor]]:
    """The digits family's held-out rows (FP32 [64] each, the split its accuracy is measured
    on), ``batch`` consecutive rows per request."""
    from profiles.digits.family import INPUT, VARIANTS, dataset

    # NOTE: every digits variant splits with the same seed and fraction: one test split
    _, x_test, _, _ = dataset(next(iter(VARIANTS.values())))
    name = inputs[0].name if inputs and len(inputs) == 1 else INPUT.name
    n = len(x_test) // batch
    if n == 0:
        raise PayloadError(f"--batch {batch} exceeds the {len(x_test)} rows of the digits test split")
    rows = np.ascontiguousarray(x_test[: n * batch], dtype=np.float32)
    return [[Tensor(name, "FP32", rows[i * batch : (i + 1) * batch])] for i in range(n)]


def parameters(slo_ms: float | None, priority: int | None, send_timeout: bool) -> dict[str, int]:
    p: dict[str, int] = {}
    if slo_ms is not None and send_timeout:
        p["timeout"] = int(round(slo_ms * 1000))
    if priority is not None:
        p["priority"] = int(priority)
    return p


def http_body(
    model: str,
    tensors: list[Tensor],
    params: dict[str, int],
    binary: bool,
    extra_headers: tuple[tuple[str, str], ...] = (),
) -> HttpBody:
    """The v2 request; ``extra_headers`` (e.g. Authorization) go with it."""
    path = f"/v2/models/{model}/infer"
    if not binary:
        doc: dict[str, Any] = {
            "inputs": [
                {"name": t.name, "shape": t.shape, "datatype": t.datatype, "data": t.json_data()}
                for t in tensors
            ]
        }
        if params:
            doc["parameters"] = params
        body = json.dumps(doc, separators=(",", ":")).encode()
        return HttpBody(path, body, (("Content-Type", "application/json"), *extra_headers))
    raws = [t.raw() for t in tensors]
    doc = {
        "inputs": [
            {
                "name": t.name,
                "shape": t.shape,
                "datatype": t.datatype,
                "parameters": {"binary_data_size": len(r)},
            }
            for t, r in zip(tensors, raws, strict=True)
        ],
        "parameters": {**params, "binary_data_output": True},
    }
    header = json.dumps(doc, separators=(",", ":")).encode()
    return HttpBody(
        path,
        header + b"".join(raws),
        (
            ("Content-Type", "application/octet-stream"),
            ("Inference-Header-Content-Length", str(len(header))),
            *extra_headers,
        ),
    )


def grpc_request(model: str, tensors: list[Tensor], params: dict[str, int]) -> bytes:
    from tritonclient.grpc import service_pb2 as pb

    req = pb.ModelInferRequest(model_name=model)
    for t in tensors:
        req.inputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
        req.raw_input_contents.append(t.raw())
    for k, v in params.items():
        req.parameters[k].int64_param = v
    return req.SerializeToString()


VARIANT_PARAM = "headrace_variant"
_VARIANT_B = VARIANT_PARAM.encode()


def variant_from_http(body: bytes, header_len: int | None) -> str | None:
    """The ``headrace_variant`` response parameter, if the response carries one."""
    head = body if header_len is None else body[:header_len]
    if _VARIANT_B not in head:
        return None
    try:
        v = json.loads(head).get("parameters", {}).get(VARIANT_PARAM)
    except (ValueError, AttributeError):
        return None
    return _param_str(v)


def variant_from_grpc(raw: bytes) -> str | None:
    if _VARIANT_B not in raw:
        return None
    from tritonclient.grpc import service_pb2 as pb

    resp = pb.ModelInferResponse.FromString(raw)
    if VARIANT_PARAM not in resp.parameters:
        return None
    p = resp.parameters[VARIANT_PARAM]
    kind = p.WhichOneof("parameter_choice")
    return None if kind is None else _param_str(getattr(p, kind))


def _param_str(v: Any) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else str(v)
