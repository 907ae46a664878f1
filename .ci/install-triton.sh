#!/usr/bin/env bash
# Install PyTriton (real tritonserver 2.51, CPU-only) into its own venv, .venv-triton.
#
# Why a separate venv: nvidia-pytriton 0.7.0 pins numpy<2, and the main venv has numpy 2.x;
# downgrading it there would change everyone else's environment. The test server runs as a
# subprocess with .venv-triton's interpreter; the gateway and tests stay in the main venv.
#
# Idempotent: when PyTriton is already importable in .venv-triton, this does nothing but print
# the environment. Prints `export LD_LIBRARY_PATH=...` (PyTriton's Python-backend stub must load
# the libpython of the interpreter that runs it, otherwise model loading fails).
#
# Usage: .ci/install-triton.sh            (from the repo root or anywhere)
#   PYTHON=/path/to/python3.11 .ci/install-triton.sh   to pick the base interpreter.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ELOQUENT_TRITON_VENV:-$ROOT/.venv-triton}"
PYTRITON_VERSION="${PYTRITON_VERSION:-0.7.0}"

if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then
    # Same base interpreter as the main venv, so LIBDIR matches what the tests expect.
    PYTHON="$("$ROOT/.venv/bin/python" -c 'import sys; print(sys._base_executable)')"
  else
    PYTHON="$(command -v python3)"
  fi
fi

if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" - "$PYTRITON_VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if version("nvidia-pytriton") == sys.argv[1] else 1)
PY
then
  echo "install-triton: nvidia-pytriton $PYTRITON_VERSION already in $VENV" >&2
else
  echo "install-triton: creating $VENV with $PYTHON" >&2
  [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "nvidia-pytriton==$PYTRITON_VERSION"
fi

LIBDIR="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')"
# Fail now, not at model-load time, if the bundled server cannot start on this box.
"$VENV/bin/python" -c 'import pytriton, pytriton.triton' >/dev/null
echo "export ELOQUENT_TRITON_PYTHON=$VENV/bin/python"
echo "export LD_LIBRARY_PATH=$LIBDIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
