"""Triton python-backend model of one "digits" variant (copied into the model repository
as ``1/model.py``, its weights beside it as ``weights.npz``).

Every ``execute`` call runs the numpy forward pass of :mod:`profiles.digits.family` once over the
rows of all requests Triton batched together, then splits the probabilities back per request.
"""

import json
import sys
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        root = params.get("headrace_root", "")
        if root and root not in sys.path:
            sys.path.insert(0, root)
        from profiles.digits.family import DigitsWeights, forward

        self._forward = forward
        vdir = Path(args["model_repository"]) / args["model_version"]
        self.weights = DigitsWeights.from_npz(vdir / params.get("weights_file", "weights.npz"))

    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        try:
            probs = self._forward(self.weights, np.concatenate(arrays, axis=0))
        except Exception as e:  # every request of a failed batch fails, with the reason
            err = pb_utils.TritonError(f"{self.weights.variant}: {e}")
            return [pb_utils.InferenceResponse(error=err) for _ in requests]
        out, start = [], 0
        for a in arrays:
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("PROBS", probs[start:start + len(a)])]))
            start += len(a)
        return out
