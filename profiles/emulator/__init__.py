"""The emulated GPU: a Triton python-backend model that takes as long as its profile says,
and one arbiter process per emulated physical GPU that applies the sharing rules."""

from profiles.emulator.calibrate import calibrate_overhead
from profiles.emulator.client import ArbiterClient, ArbiterError
from profiles.emulator.gpu import EmulatedGpu
from profiles.emulator.overhead import DEFAULT_OVERHEAD, Overhead
from profiles.emulator.repository import write_emulated_model

__all__ = [
    "DEFAULT_OVERHEAD", "ArbiterClient", "ArbiterError", "EmulatedGpu", "Overhead", "calibrate_overhead",
    "write_emulated_model",
]
