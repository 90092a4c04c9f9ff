"""The Python build backend of the `oomtrace` package (python/pyproject.toml's `build-backend`).

maturin builds and packs the `oomtrace` binary and the Python package; this adds what maturin
cannot: liboomtrace.so, a second Rust artifact (the shim crate's cdylib) that the binary expects
beside itself. Every wheel this backend builds (`pip install ./python`, `pip wheel python/`,
`python -m build`, also from the sdist) gets the library compiled by that same build:

1. maturin builds the wheel (binary stripped, Python package);
2. `cargo build --release -p oomtrace-shim` builds the library from the same sources, in the
   same cargo target directory (cargo's default or CARGO_TARGET_DIR, as maturin's build);
   cargo names the file it made (`--message-format=json`), so no path is guessed;
3. the library is written into the wheel as `oomtrace-<version>.data/scripts/liboomtrace.so`
   (installed into the environment's bin/, beside `oomtrace`), replacing any entry of that
   name, and the wheel's RECORD is rewritten to match.

Nothing is staged in the source tree, so no build ships a library left there by another, and
two builds from one tree at once do not meet. `scripts/wheel.sh` (the manylinux wheel, zig)
builds its own library and adds it with step 3: `python oomtrace_backend.py add-library WHEEL
LIB`.

The sdist is maturin's: cli's `bundle-shim` feature (turned on in pyproject.toml) makes the
shim crate a dependency, which is what brings its sources into maturin's sdist.
"""

import base64
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile

import maturin

# The hooks this module does not change are maturin's own.
get_requires_for_build_wheel = maturin.get_requires_for_build_wheel
get_requires_for_build_sdist = maturin.get_requires_for_build_sdist
get_requires_for_build_editable = maturin.get_requires_for_build_editable
prepare_metadata_for_build_wheel = maturin.prepare_metadata_for_build_wheel
build_sdist = maturin.build_sdist

_LIB_NAME = "liboomtrace.so"
_SHIM_PACKAGE = "oomtrace-shim"


def _manifest_path():
    """pyproject.toml's `[tool.maturin] manifest-path` (cli/Cargo.toml; the sdist's differs)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    with open("pyproject.toml", "rb") as f:
        config = tomllib.load(f)
    return config["tool"]["maturin"]["manifest-path"]


def build_library():
    """Builds liboomtrace.so in release and returns the path cargo reports for it."""
    cargo = os.environ.get("CARGO") or shutil.which("cargo")
    if not cargo:
        raise RuntimeError("oomtrace: building liboomtrace.so needs cargo (https://rustup.rs)")
    command = [
        cargo,
        "build",
        "--release",
        "-p",
        _SHIM_PACKAGE,
        "--manifest-path",
        _manifest_path(),
        "--message-format=json-render-diagnostics",
    ]
    print("Running `{}`".format(" ".join(command)), file=sys.stderr)
    # Cargo's messages on stdout are for us; its progress and errors go to stderr as usual.
    result = subprocess.run(command, stdout=subprocess.PIPE, check=False)
    if result.returncode != 0:
        raise RuntimeError("oomtrace: building liboomtrace.so failed (cargo's errors above)")
    found = []
    for line in result.stdout.decode("utf-8", "replace").splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("reason") != "compiler-artifact":
            continue
        if "cdylib" not in message.get("target", {}).get("kind", []):
            continue
        found += [f for f in message.get("filenames", []) if os.path.basename(f) == _LIB_NAME]
    if len(found) != 1:
        raise RuntimeError(
            "oomtrace: cargo built {} files named {} (expected one): {}".format(
                len(found), _LIB_NAME, found
            )
        )
    return found[0]


def _record_hash(data):
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def add_library(wheel, library):
    """Writes `library` into `wheel` as `<name>-<version>.data/scripts/liboomtrace.so` (an
    entry of that name already there is replaced) and rewrites the wheel's RECORD."""
    with open(library, "rb") as f:
        data = f.read()
    with zipfile.ZipFile(wheel) as source:
        entries = source.infolist()
        records = [e.filename for e in entries if e.filename.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise RuntimeError("oomtrace: {} has {} RECORD files".format(wheel, len(records)))
        record_name = records[0]
        distribution = record_name[: -len(".dist-info/RECORD")]
        target = "{}.data/scripts/{}".format(distribution, _LIB_NAME)
        record_lines = [
            line
            for line in source.read(record_name).decode("utf-8").splitlines()
            if line and line.split(",", 1)[0] not in (target, record_name)
        ]
        record_lines.append("{},{},{}".format(target, _record_hash(data), len(data)))
        record_lines.append("{},,".format(record_name))
        partial = wheel + ".partial"
        try:
            _write(partial, source, entries, target, data, record_name, record_lines)
        except BaseException:
            if os.path.exists(partial):
                os.remove(partial)
            raise
    os.replace(partial, wheel)


def _write(partial, source, entries, target, data, record_name, record_lines):
    """The new wheel: every entry of `source` but the library and RECORD, then those two."""
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as out:
        for entry in entries:
            if entry.filename in (target, record_name):
                continue
            out.writestr(entry, source.read(entry.filename))
        info = zipfile.ZipInfo(target, date_time=entries[0].date_time)
        info.external_attr = (stat.S_IFREG | 0o755) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        out.writestr(info, data)
        record = zipfile.ZipInfo(record_name, date_time=entries[0].date_time)
        record.external_attr = (stat.S_IFREG | 0o644) << 16
        record.compress_type = zipfile.ZIP_DEFLATED
        out.writestr(record, "\n".join(record_lines) + "\n")


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = maturin.build_wheel(wheel_directory, config_settings, metadata_directory)
    add_library(os.path.join(wheel_directory, name), build_library())
    return name


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name = maturin.build_editable(wheel_directory, config_settings, metadata_directory)
    add_library(os.path.join(wheel_directory, name), build_library())
    return name


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "add-library":
        sys.exit("usage: oomtrace_backend.py add-library WHEEL LIBRARY")
    add_library(sys.argv[2], sys.argv[3])
