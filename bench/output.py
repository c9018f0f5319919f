"""Where every benchmark puts its results: ``<out>/<name>.json`` (every number) and
``<out>/<name>.md`` (the tables a reader looks at), side by side in ``bench/results/``, and the
commit they were measured at."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any


def git_commit() -> str:
    """The short commit the benchmark ran at ("" outside a git checkout)."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent).stdout.strip()


def write_results(out: Path | str, name: str, result: Any, md: str) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{name}.md").write_text(md)
