#!/usr/bin/env bash
# Runs each cargo-fuzz target (fuzz/) for SECONDS (default 20) from the committed seeds.
# A crash fails (its input is left in fuzz/artifacts/); missing tools are installed: the
# nightly toolchain (cargo-fuzz needs it for the sanitizers) and cargo-fuzz itself.
# Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
SECS=${1:-20}
cd "$(dirname "$0")/../fuzz"
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    if ! rustup toolchain install nightly --profile minimal >/dev/null 2>&1; then
        echo "fuzz: the nightly toolchain cannot be installed here; fuzzing skipped" >&2
        # Under CI a skipped check is a failed one.
        [ -z "${CI:-}" ] && exit 0
        exit 1
    fi
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked --quiet
fi
for target in trace_reader wire_decoder snapshot_reader; do
    mkdir -p "corpus/$target"
    echo "fuzz: $target for ${SECS} s"
    status=0
    cargo +nightly fuzz run "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$SECS" > "corpus/$target.log" 2>&1 || status=$?
    grep -E "^Done|panicked at" "corpus/$target.log" || true
    if [ "$status" -ne 0 ]; then
        tail -40 "corpus/$target.log" >&2
        echo "fuzz: $target crashed; its input is in fuzz/artifacts/$target" >&2
        exit 1
    fi
done
