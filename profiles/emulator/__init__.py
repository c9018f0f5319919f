"""The emulated hardware: the emulated GPU (a Triton python-backend model that takes as long as
its profile says, and one arbiter per emulated physical GPU applying the sharing rules) and the
emulated LLM engine (the engine model of :mod:`profiles.llm` in real time, served behind vLLM's
OpenAI API by ``headrace engine`` and as a decoupled Triton model)."""

from profiles.emulator.calibrate import calibrate_overhead
from profiles.emulator.client import ArbiterClient, ArbiterError
from profiles.emulator.gpu import EmulatedGpu
from profiles.emulator.overhead import DEFAULT_OVERHEAD, Overhead
from profiles.emulator.repository import write_emulated_model

__all__ = [
    "DEFAULT_OVERHEAD", "ArbiterClient", "ArbiterError", "EmulatedGpu", "Overhead", "calibrate_overhead",
    "write_emulated_model",
]
