"""Version 2 of a user's Triton python-backend model: OUTPUT0 = INPUT0 x 3 (the factor tells
which version answered)."""

import numpy as np
import triton_python_backend_utils as pb_utils

FACTOR = 3.0


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (x * FACTOR).astype(np.float32))]))
        return out
