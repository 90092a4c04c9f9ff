#!/usr/bin/env bash
# Runs the real-PyTorch test tier (tests/it/torch.rs) on any torch release from PyPI, on demand:
# makes (or reuses) that release's venv with scripts/torch-env.sh, then runs the integration
# tests with TORCH_TIER_VERSION=VERSION, which makes every real-PyTorch test use that venv.
#
# Usage: scripts/torch-tier.sh VERSION [TEST FILTER OR LIBTEST FLAG...]
#   scripts/torch-tier.sh 2.6.0                           # the tests meant for every version
#   scripts/torch-tier.sh 2.8.0 torch::simcuda_runs_real_pytorch
#   scripts/torch-tier.sh 2.4.1 torch::leaky_loop:: --test-threads=1
# Without a filter it runs what must hold on every supported release: `torch::every_version::`
# (tests/it/torch/every_version.rs) and simcuda's own checks (`torch::simcuda_runs_real_pytorch*`);
# `torch::` is the whole tier (written for the pinned release).
# CI runs it on the oldest supported 2.4.x and on 2.8.0 (.ci/run); `cargo test` runs the pinned
# release (scripts/torch-env.sh's PINNED_VERSION).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
    echo "usage: scripts/torch-tier.sh VERSION [TEST FILTER...]  (VERSION: a torch release, e.g. 2.8.0)" >&2
    exit 2
fi
version=$1
shift
# Validates the version and installs the venv first, so that a download shows up on its own
# (and a bad version is one line, before anything is built).
python=$(scripts/torch-env.sh "$version")
echo "torch-tier: torch $version from $python" >&2

if [ $# -eq 0 ]; then
    # Also what issue 34 asks of every release: one bug one finding, backward-pass memory in
    # forward lines (report, diff, exports, view) and what the memory is in the view; and of
    # issue 35, an OOM under a memory-fraction cap (PyTorch's out-of-memory observer); of
    # issue 38, snapshots that release wrote read as traces, and the Python API, the pytest
    # plugin and a notebook on it.
    set -- torch::every_version:: torch::simcuda_runs_real_pytorch torch::one_bug:: \
        torch::torch_backward_allocations_are_named torch::torch_a_backward_pass \
        view::a_pytorch_backward_pass view::a_pytorch_trace_shows_what \
        torch::memory_cap:: torch::snapshots:: torch::python_api::
fi
TORCH_TIER_VERSION=$version exec cargo test -p oomtrace-tests --test it -- "$@"
