"""Triton python-backend model of an emulated GPU slice (copied into a repository as model.py).

``execute`` sums the rows of every request Triton hands it, takes the profile's latency for that
batch (p50, or seeded jitter toward p99), runs that work on the emulated GPU (through the
arbiter when one is given, else alone on its slice) and answers OUTPUT = INPUT + 1 per request.
Settings come from the model config ``parameters`` written by ``write_emulated_model``.
"""

import json
import random
import time
from dataclasses import replace
from pathlib import Path

import triton_python_backend_utils as pb_utils

from profiles.emulator.batchtime import batch_seconds
from profiles.emulator.client import ArbiterClient, ArbiterError
from profiles.emulator.overhead import Overhead
from profiles.emulator.timing import wait_until
from profiles.profile import load_profiles
from profiles.sharing import ActiveJob, mps_terms, progress_rates


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        p = {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
        self.profile = load_profiles(Path(__file__).parent / "profile.yaml")[0]
        self.job = ActiveJob(
            slice_id=p["slice_id"], client=p["client"], mode=p["mode"],
            share=float(p["share"]), interference=float(p["interference"]),
        )
        self.overhead = Overhead.from_params(p)
        seed = f"{p.get('seed', '0')}/{args['model_instance_name']}"
        self.rng = random.Random(seed) if p.get("jitter") == "true" else None
        self.arbiter = ArbiterClient(p["arbiter"]) if p.get("arbiter") else None
        # an MPS share below 1 slows each batch by its own shape (profiles.sharing.mps_terms)
        self.shaped = self.job.mode == "mps" and self.job.share < 1.0
        self.solo_rate = progress_rates([self.job])[0]
        self.in_name = cfg["input"][0]["name"]
        self.out_name = cfg["output"][0]["name"]
        self.out_dtype = pb_utils.triton_string_to_numpy(cfg["output"][0]["data_type"])

    def execute(self, requests):
        t0 = time.monotonic()
        arrays = [pb_utils.get_input_tensor_by_name(r, self.in_name).as_numpy() for r in requests]
        rows = sum(int(a.shape[0]) for a in arrays)
        try:
            work = batch_seconds(self.profile, rows, self.rng)
            # Triton's own cost is paid outside the emulated GPU: end the wait that much early
            early = self.overhead.seconds(work)
            job = replace(self.job, terms=mps_terms(self.profile, rows, "p50")) if self.shaped else self.job
            if self.arbiter is not None:
                self.arbiter.run(job, work, early=early)
            else:
                rate = progress_rates([job])[0] if self.shaped else self.solo_rate
                wait_until(t0 + work / rate - early)
        except (ArbiterError, ValueError) as e:
            err = pb_utils.TritonError(f"emulated GPU {self.job.slice_id}: {e}")
            return [pb_utils.InferenceResponse(output_tensors=[], error=err) for _ in requests]
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(self.out_name, (a + 1).astype(self.out_dtype))])
            for a in arrays
        ]

    def finalize(self):
        if self.arbiter is not None:
            self.arbiter.close()
