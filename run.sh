#!/usr/bin/env bash
# headrace developer entry point: `./run.sh demo` (the main job) or `./run.sh test` (the tests).
# Each creates .venv on first use and installs headrace with what it needs.
set -euo pipefail
cd "$(dirname "$0")"

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.headrace-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e '.[test,tracing,compiled]'
  echo "$want" > "$stamp"
fi
# the compiled core (gateway/compiled.py): builds only what changed; pure Python without a compiler
.venv/bin/headrace compile --if-available

cmd=${1:-demo}
shift || true
case "$cmd" in
  demo) exec .venv/bin/headrace demo "$@" ;;
  test)
    .venv/bin/ruff check .
    exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
    ;;
  *) echo "usage: ./run.sh demo|test [args...]" >&2; exit 2 ;;
esac
