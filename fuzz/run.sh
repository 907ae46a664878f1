#!/usr/bin/env bash
# Run every fuzz target for RUNS inputs each (default 1,000,000), one after another.
#   fuzz/run.sh [RUNS] [TARGET...]        e.g. fuzz/run.sh 2000000 wire receiver
# Seeds are read from fuzz/corpus/<target>/ (never written); new inputs go to $FUZZ_WORK/<target>/
# (default: a temporary directory); crash reproducers go to fuzz/crashes/; logs to $FUZZ_WORK/<target>.log.
# Exit status: 0 when every target finished its runs without a crash.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
runs="${1:-1000000}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(wire sender_acks receiver sse_parser requests resume_ids)
fi
python="${PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python=python3
work="${FUZZ_WORK:-$(mktemp -d -t eloquent-fuzz.XXXXXX)}"
mkdir -p "$work" "$here/crashes"

declare -A max_len=([wire]=2048 [sender_acks]=512 [receiver]=512 [sse_parser]=256 [requests]=1024 [resume_ids]=256)

status=0
for target in "${targets[@]}"; do
    mkdir -p "$work/$target"
    log="$work/$target.log"
    start=$(date +%s)
    echo "== $target: $runs runs (log: $log)"
    dirs=("$work/$target")
    [ -d "$here/corpus/$target" ] && dirs+=("$here/corpus/$target")
    if (cd "$root" && "$python" "$here/fuzz_$target.py" -atheris_runs="$runs" -max_len="${max_len[$target]:-1024}" \
            -print_final_stats=1 -report_slow_units=600 -artifact_prefix="$here/crashes/$target-" \
            "${dirs[@]}") >"$log" 2>&1; then
        result=ok
    else
        result=FAILED
        status=1
    fi
    secs=$(( $(date +%s) - start ))
    done_line=$(grep -E '^Done [0-9]+ ' "$log" | tail -1 || true)
    cov=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+' || true)
    echo "   $result in ${secs}s; ${done_line:-no Done line}; last ${cov:-cov n/a}"
    [ "$result" = ok ] || tail -40 "$log"
done
exit $status
