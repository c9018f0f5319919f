#!/usr/bin/env bash
# headrace developer entry point: `./run.sh demo` (the main job) or `./run.sh test` (the tests).
# Each creates .venv on first use and installs headrace with what that command needs: the demo
# the package, Cython and the openai client (no Ray, no test tools), the tests everything else too.
set -euo pipefail
cd "$(dirname "$0")"

cmd=${1:-demo}
shift || true
case "$cmd" in
  demo) extras=(compiled openai) ;;
  test) extras=(compiled test tracing) ;;
  *) echo "usage: ./run.sh demo|test [args...]" >&2; exit 2 ;;
esac

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# The stamp's first line is the pyproject.toml it installed; each further line an extra installed
# from it. A changed pyproject.toml starts the list again; a command needing an extra not listed
# (`./run.sh test` after `./run.sh demo`) installs it.
stamp=.venv/.headrace-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
have=()
if [ -f "$stamp" ] && [ "$(head -n1 "$stamp")" = "$want" ]; then
  mapfile -t have < <(tail -n +2 "$stamp")
fi
missing=()
for e in "${extras[@]}"; do
  [[ " ${have[*]} " == *" $e "* ]] || missing+=("$e")
done
if [ ${#missing[@]} -gt 0 ]; then
  all=("${have[@]}" "${missing[@]}")
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e ".[$(IFS=,; echo "${all[*]}")]"
  printf '%s\n' "$want" "${all[@]}" > "$stamp"
fi
# the compiled core (profiles/compiled.py): builds only what changed; pure Python without a compiler
.venv/bin/headrace compile --if-available

case "$cmd" in
  demo) exec .venv/bin/headrace demo "$@" ;;
  test)
    .venv/bin/ruff check .
    exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
    ;;
esac
