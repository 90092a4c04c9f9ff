#!/usr/bin/env bash
# Creates (or reuses) the virtual environment with one real PyTorch CUDA wheel from PyPI that the
# real-PyTorch test tier runs on, and prints its python interpreter's path on stdout.
#
# VERSION is a torch release from PyPI (`pip index versions torch`); without it, the pinned one
# (2.15.0). Each version gets its own venv, outside the clone, in a cache directory keyed by the
# torch version and the Python version, so every clone and every CI run on a machine shares one
# copy (2.5 to 5.4 GB of wheels; a few minutes the first time, pip's own cache makes a second
# install faster):
#   $TORCH_ENV_DIR                    if set (one venv: it must hold VERSION), or
#   ${XDG_CACHE_HOME:-~/.cache}/oomtrace-torch-env/torch-<version>-py<major.minor>
# What `pip install torch==VERSION` brings is what is installed: its own CUDA runtime, cuBLAS and
# cuDNN wheels (nvidia-*-cu12 for 2.4 to 2.8, CUDA 13 ones after).
#
# Usage: scripts/torch-env.sh [VERSION]            # create if missing, print the interpreter path
#        scripts/torch-env.sh --check [VERSION]    # exit 1 (one line on stderr) if it is not ready
set -euo pipefail

PINNED_VERSION=2.15.0
PYTHON=${TORCH_ENV_PYTHON:-python3}

check=no
if [ "${1:-}" = "--check" ]; then
    check=yes
    shift
fi
if [ $# -gt 1 ]; then
    echo "torch-env: one torch version at most, got: $*" >&2
    exit 2
fi
TORCH_VERSION=${1:-$PINNED_VERSION}
# A release number only: it names a directory and goes to pip as `torch==VERSION`.
if ! [[ "$TORCH_VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    echo "torch-env: bad torch version '$TORCH_VERSION' (want a release like $PINNED_VERSION; see \`pip index versions torch\`)" >&2
    exit 2
fi

pyver=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
env_dir=${TORCH_ENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/oomtrace-torch-env/torch-$TORCH_VERSION-py$pyver}
# The ready mark holds the torch version installed (an empty mark, from before versions were
# recorded, is the pinned one's).
ready="$env_dir/.oomtrace-ready"

# What the tier runs besides torch (pinned, like torch): real pytest for the plugin, a real
# Jupyter kernel for the notebook (docs/pytorch.md, "In a notebook, in pytest").
TOOLS="pytest==9.2.0 nbclient==0.11.0 nbformat==5.11.1 ipykernel==7.4.0"
tools_ready() {
    "$env_dir/bin/python" -c 'import pytest, nbclient, nbformat, ipykernel' 2>/dev/null
}

# Prints the interpreter and exits if the venv is ready; refuses a ready venv of another
# version (TORCH_ENV_DIR names one venv).
if_ready() {
    if [ -f "$ready" ] && [ -x "$env_dir/bin/python" ] && tools_ready; then
        local made
        made=$(cat "$ready")
        made=${made:-$PINNED_VERSION}
        if [ "$made" != "$TORCH_VERSION" ]; then
            echo "torch-env: $env_dir holds torch $made, not $TORCH_VERSION; unset TORCH_ENV_DIR or point it elsewhere" >&2
            exit 1
        fi
        echo "$env_dir/bin/python"
        exit 0
    fi
}

if_ready
if [ "$check" = yes ]; then
    echo "torch-env: no PyTorch $TORCH_VERSION environment at $env_dir (run scripts/torch-env.sh $TORCH_VERSION)" >&2
    exit 1
fi

# One installer at a time: two test processes (or two clones) may ask at once.
mkdir -p "$(dirname "$env_dir")"
exec 9>"$env_dir.lock"
flock 9
if_ready

# A ready venv made before the tools: they are added to it.
if [ -f "$ready" ] && [ -x "$env_dir/bin/python" ] && [ "$(cat "$ready")" = "$TORCH_VERSION" ]; then
    # shellcheck disable=SC2086
    "$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check $TOOLS >&2
    if_ready
    echo "torch-env: the tools ($TOOLS) could not be installed into $env_dir" >&2
    exit 1
fi

echo "torch-env: installing torch==$TORCH_VERSION into $env_dir (2.5 to 5.4 GB, a few minutes the first time)" >&2
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
# shellcheck disable=SC2086
"$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check "torch==$TORCH_VERSION" $TOOLS >&2
# The interpreter's own check that the wheel is a CUDA build (its runtime ships libcudart).
"$env_dir/bin/python" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)' \
    || { echo "torch-env: torch $TORCH_VERSION installed but it is not a CUDA build" >&2; exit 1; }
echo "$TORCH_VERSION" >"$ready"
echo "$env_dir/bin/python"
