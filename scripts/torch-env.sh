#!/usr/bin/env bash
# Creates (or reuses) the virtual environment with the pinned real PyTorch CUDA wheel that the
# real-PyTorch test tier runs on, and prints its python interpreter's path on stdout.
#
# The venv lives outside the clone, in a cache directory keyed by the torch version and the
# Python version, so every clone and every CI run on a machine shares one copy (about 5.4 GB of
# wheels; a few minutes the first time, pip's own cache makes a second install faster):
#   $TORCH_ENV_DIR                    if set, or
#   ${XDG_CACHE_HOME:-~/.cache}/oomtrace-torch-env/torch-<version>-py<major.minor>
#
# Usage: scripts/torch-env.sh            # create if missing, print the interpreter path
#        scripts/torch-env.sh --check    # exit 1 (one line on stderr) if it is not ready
set -euo pipefail

TORCH_VERSION=2.15.0
PYTHON=${TORCH_ENV_PYTHON:-python3}

pyver=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
env_dir=${TORCH_ENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/oomtrace-torch-env/torch-$TORCH_VERSION-py$pyver}
ready="$env_dir/.oomtrace-ready"

if [ -f "$ready" ] && [ -x "$env_dir/bin/python" ]; then
    echo "$env_dir/bin/python"
    exit 0
fi
if [ "${1:-}" = "--check" ]; then
    echo "torch-env: no PyTorch $TORCH_VERSION environment at $env_dir (run scripts/torch-env.sh)" >&2
    exit 1
fi

# One installer at a time: two test processes (or two clones) may ask at once.
mkdir -p "$(dirname "$env_dir")"
exec 9>"$env_dir.lock"
flock 9
if [ -f "$ready" ] && [ -x "$env_dir/bin/python" ]; then
    echo "$env_dir/bin/python"
    exit 0
fi

echo "torch-env: installing torch==$TORCH_VERSION into $env_dir (about 5.4 GB, a few minutes the first time)" >&2
# A half-made environment from an interrupted install is ours (it has no ready mark): start over.
if [ -d "$env_dir" ] && [ -f "$env_dir/.oomtrace-env" ]; then
    rm -rf "$env_dir"
fi
if [ -e "$env_dir" ]; then
    echo "torch-env: $env_dir exists and was not made by this script; remove it or set TORCH_ENV_DIR" >&2
    exit 1
fi
"$PYTHON" -m venv "$env_dir"
touch "$env_dir/.oomtrace-env"
"$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check "torch==$TORCH_VERSION" >&2
# The interpreter's own check that the wheel is a CUDA build (its runtime ships libcudart).
"$env_dir/bin/python" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)' \
    || { echo "torch-env: torch $TORCH_VERSION installed but it is not a CUDA build" >&2; exit 1; }
touch "$ready"
echo "$env_dir/bin/python"
