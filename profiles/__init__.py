"""Latency/memory/accuracy profiles of model variants on GPU slices, the profiler that
measures them on a live Triton model, and the emulated GPU that replays them."""

from profiles.profile import LatencyPoint, Profile, ProfileError, ProfileSet, Provenance

__all__ = ["LatencyPoint", "Profile", "ProfileError", "ProfileSet", "Provenance"]
