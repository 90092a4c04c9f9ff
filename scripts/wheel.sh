#!/usr/bin/env bash
# Builds the `oomtrace` manylinux wheel (the binary, liboomtrace.so beside it, the Python
# package) into OUT_DIR and prints the wheel's path on stdout. Manylinux 2.28: everything is
# compiled and linked by zig against glibc 2.28's symbols (docs/PACKAGING.md says why and how).
# `pip install ./python` builds the same package for this machine's glibc without zig.
#
# The tools (maturin, ziglang, cargo-zigbuild, auditwheel, and `build` for the sdist test;
# pinned below) live in a venv outside the clone, shared by every clone and CI run on the
# machine, made on first use:
#   $WHEEL_TOOLS_DIR                  if set, or
#   ${XDG_CACHE_HOME:-~/.cache}/oomtrace-wheel-tools/<pins>-py<major.minor>
# Cargo builds into $WHEEL_TARGET_DIR (default: target/wheel in the clone), never the usual
# target directory: the wheel's build is for another glibc, with another C compiler. The shim
# and the binary each have their own directory under it: cargo-zigbuild and maturin configure
# cargo differently, and in one directory each would rebuild the dependencies they share every
# time the other had built them.
#
# Usage: scripts/wheel.sh OUT_DIR            # build; print OUT_DIR/oomtrace-<version>-...whl
#        scripts/wheel.sh --tools            # make the tools venv if missing; print its bin/
#        scripts/wheel.sh --glibc FILE...    # each ELF file's newest GLIBC_ symbol version
set -euo pipefail

MATURIN_VERSION=1.16.0
ZIGLANG_VERSION=0.15.2
CARGO_ZIGBUILD_VERSION=0.24.1
AUDITWHEEL_VERSION=6.8.2
BUILD_VERSION=1.6.1
# The oldest glibc the wheel runs on (manylinux_2_28: RHEL 8, Debian 10, Ubuntu 18.10 and newer).
GLIBC=2.28
TARGET=x86_64-unknown-linux-gnu
PYTHON=${WHEEL_TOOLS_PYTHON:-python3}

repo=$(cd "$(dirname "$0")/.." && pwd)

tools() {
    local pyver pins dir ready
    pyver=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
    pins="maturin-$MATURIN_VERSION-zig-$ZIGLANG_VERSION-zigbuild-$CARGO_ZIGBUILD_VERSION-auditwheel-$AUDITWHEEL_VERSION-build-$BUILD_VERSION"
    dir=${WHEEL_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/oomtrace-wheel-tools/$pins-py$pyver}
    ready="$dir/.oomtrace-ready"
    if [ -f "$ready" ] && [ -x "$dir/bin/maturin" ]; then
        echo "$dir/bin"
        return
    fi
    # One installer at a time: the test and a developer may ask at once.
    mkdir -p "$(dirname "$dir")"
    exec 9>"$dir.lock"
    flock 9
    if [ -f "$ready" ] && [ -x "$dir/bin/maturin" ]; then
        echo "$dir/bin"
        return
    fi
    echo "wheel: installing the build tools into $dir" >&2
    # A half-made venv from an interrupted install is ours (it has no ready mark): start over.
    if [ -d "$dir" ] && [ -f "$dir/.oomtrace-env" ]; then
        rm -rf "$dir"
    fi
    if [ -e "$dir" ]; then
        echo "wheel: $dir exists and was not made by this script; remove it or set WHEEL_TOOLS_DIR" >&2
        exit 1
    fi
    "$PYTHON" -m venv "$dir"
    touch "$dir/.oomtrace-env"
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check \
        "maturin==$MATURIN_VERSION" "ziglang==$ZIGLANG_VERSION" \
        "cargo-zigbuild==$CARGO_ZIGBUILD_VERSION" "auditwheel==$AUDITWHEEL_VERSION" \
        "build==$BUILD_VERSION" >&2
    touch "$ready"
    echo "$dir/bin"
}

# The newest GLIBC_x.y version each file's dynamic symbols need (pyelftools comes with
# auditwheel), one "FILE GLIBC_x.y" line per file ("FILE none" if it needs no versioned one).
glibc_needed() {
    local bin
    bin=$(tools)
    "$bin/python" - "$@" <<'EOF'
import sys
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

for path in sys.argv[1:]:
    with open(path, "rb") as f:
        elf = ELFFile(f)
        versions = []
        for section in elf.iter_sections():
            if isinstance(section, GNUVerNeedSection):
                for _, auxiliaries in section.iter_versions():
                    for aux in auxiliaries:
                        if aux.name.startswith("GLIBC_") and aux.name[6:7].isdigit():
                            versions.append(tuple(int(p) for p in aux.name[6:].split(".")))
        newest = "GLIBC_" + ".".join(map(str, max(versions))) if versions else "none"
        print(path, newest)
EOF
}

case "${1:-}" in
    --tools)
        tools
        exit 0
        ;;
    --glibc)
        shift
        [ $# -gt 0 ] || { echo "usage: scripts/wheel.sh --glibc FILE..." >&2; exit 2; }
        glibc_needed "$@"
        exit 0
        ;;
    "" | -*)
        echo "usage: scripts/wheel.sh OUT_DIR | --tools | --glibc FILE..." >&2
        exit 2
        ;;
esac

out=$1
mkdir -p "$out"
out=$(cd "$out" && pwd)
bin=$(tools)
target_dir=${WHEEL_TARGET_DIR:-$repo/target/wheel}
export PATH="$bin:$PATH"
# The wheel's build owns its compilers and flags; a developer's own must not leak in.
unset RUSTFLAGS CARGO_ENCODED_RUSTFLAGS CARGO_BUILD_RUSTFLAGS CC CFLAGS

# 1. liboomtrace.so, against glibc 2.28 (cargo-zigbuild: zig cc links it).
cargo-zigbuild zigbuild --release --locked --quiet -p oomtrace-shim \
    --manifest-path "$repo/Cargo.toml" --target "$TARGET.$GLIBC" --target-dir "$target_dir/shim" >&2

# 2. The binary and the wheel (maturin's zig mode compiles the binary's C parts, the demo and
#    the simulated CUDA it carries, with the same zig cc). `--auditwheel check` fails the build
#    if anything needs a newer glibc or a library outside manylinux's list.
before=$(mktemp -d)
trap 'rm -rf "$before"' EXIT
(cd "$repo/python" && CARGO_TARGET_DIR="$target_dir/cli" maturin build --release --locked --quiet \
    --zig --compatibility "manylinux_${GLIBC/./_}" --auditwheel check --out "$before") >&2
wheel=$(ls "$before"/oomtrace-*.whl)

# 3. The library into the wheel's .data/scripts/ (installed into the environment's bin/, beside
#    the binary), as the Python build backend adds it to the wheels pip builds.
"$bin/python" "$repo/python/build_backend/oomtrace_backend.py" add-library "$wheel" \
    "$target_dir/shim/$TARGET/release/liboomtrace.so"
mv -f "$wheel" "$out/"
echo "$out/$(basename "$wheel")"
