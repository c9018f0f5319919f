"""Where every benchmark puts its results: ``<out>/<name>.json`` (every number) and
``<out>/<name>.md`` (the tables a reader looks at), side by side in ``bench/results/``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_results(out: Path | str, name: str, result: Any, md: str) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{name}.md").write_text(md)
