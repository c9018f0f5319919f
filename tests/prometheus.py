"""Reading a /metrics page in tests: every sample by its name and labels, as Prometheus writes them."""

from __future__ import annotations

import urllib.request


def samples(url: str) -> dict[str, float]:
    """``{'name{label="v",...}': value}`` of every sample ``url`` serves."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out
