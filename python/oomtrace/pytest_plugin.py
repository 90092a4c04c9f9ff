"""The pytest plugin (installed with the `oomtrace` package, entry point `pytest11`).

    @pytest.mark.oomtrace(limit="2GiB", leaks=False)
    def test_training_step():
        ...

A marked test is traced as one block (`oomtrace.trace()`): it fails when PyTorch's tensors on
one device rose more than `limit` (a size, "2GiB", or bytes) above what was live when it began
(`Trace.own_tensor_peak_bytes`: the test's own GPU memory at its peak), or, with
`leaks=False`, when oomtrace found a leak in it; the failure text has the findings. The
`oomtrace_trace` fixture gives a test its own block (`oomtrace.Trace`, ended after the test)
to check anything else.

Without a GPU, `pytest --oomtrace-simulate 16GiB` (or the `oomtrace_simulate` ini option)
runs the session on the simulated GPU `oomtrace` carries: its driver is loaded into pytest's
process before anything starts CUDA, so PyTorch sees one simulated device of that size.
Never chosen without being asked: a suite whose tests check that no GPU is there keeps
seeing none.
"""

import ctypes
import os
import subprocess

import pytest

from oomtrace._session import OomtraceError, Trace, _binary

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(text):
    """Bytes of "2GiB", "512 MiB", "1.5GB" or an int."""
    if isinstance(text, int):
        return text
    s = str(text).strip().lower().replace(" ", "")
    number = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(number):]
    if unit not in _UNITS or not number:
        raise ValueError("oomtrace: %r is not a size (like 2GiB, 512MiB or 1000000)" % text)
    return int(float(number) * _UNITS[unit])


def _fmt(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return "%.2f %s" % (n / size, unit)
    return "%d B" % n


def pytest_addoption(parser):
    group = parser.getgroup("oomtrace")
    group.addoption("--oomtrace-simulate", metavar="SIZE", default=None,
                    help="run the session on oomtrace's simulated GPU of SIZE (e.g. 16GiB), "
                         "for machines without a GPU")
    parser.addini("oomtrace_simulate", "as --oomtrace-simulate", default="")


def _simulate(size):
    """Loads the simulated driver `oomtrace lib --simulate SIZE` names into this process,
    before anything starts CUDA: PyTorch's own dlopen of libcuda.so.1 then finds it."""
    try:
        env = subprocess.run([_binary(), "lib", "--simulate", size], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, check=True, timeout=60).stdout.decode()
    except (OSError, subprocess.SubprocessError, OomtraceError) as e:
        raise pytest.UsageError("oomtrace: cannot set up the simulated GPU: %s" % e)
    values = dict(item.split("=", 1) for item in env.split() if "=" in item)
    driver_dir = values.get("LD_LIBRARY_PATH", "").split(":")[0]
    for name in ("SIMCUDA_MEMORY", "CUDA_MODULE_LOADING"):
        if name in values:
            os.environ[name] = values[name]
    try:
        ctypes.CDLL(os.path.join(driver_dir, "libcuda.so.1"), mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise pytest.UsageError("oomtrace: cannot load the simulated GPU's driver: %s" % e)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "oomtrace(limit=None, leaks=True): trace the test's GPU memory with oomtrace; fail it "
        "when PyTorch's tensors reach more than limit at once, or (leaks=False) when it leaks")
    size = config.getoption("--oomtrace-simulate") or config.getini("oomtrace_simulate")
    if size:
        _simulate(size)


def _skip_without_gpu():
    """A traced test without any GPU (none, and no --oomtrace-simulate) is skipped, saying
    how to run it, instead of failing on its first CUDA call."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and not torch.cuda.is_available():
        pytest.skip("oomtrace: no GPU here (pytest --oomtrace-simulate 16GiB runs the session "
                    "on the simulated one)")


@pytest.fixture
def oomtrace_trace():
    """The test traced as one block: an `oomtrace.Trace`, ended (its report made) after it."""
    t = Trace().start()
    yield t
    t.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # Before the test's fixtures, which may already need CUDA.
    if item.get_closest_marker("oomtrace") is not None or "oomtrace_trace" in getattr(
            item, "fixturenames", ()):
        _skip_without_gpu()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    marker = item.get_closest_marker("oomtrace")
    if marker is None:
        return (yield)
    limit = marker.kwargs.get("limit")
    limit = None if limit is None else parse_size(limit)
    leaks_allowed = marker.kwargs.get("leaks", True)
    t = Trace().start()
    try:
        result = yield
    finally:
        t.stop()
    failures = []
    peak = t.own_tensor_peak_bytes
    if limit is not None and peak > limit:
        failures.append("GPU peak %s is over the limit of %s (PyTorch's tensors at their "
                        "peak during the test, above what was live when it began)"
                        % (_fmt(peak), _fmt(limit)))
    if not leaks_allowed and t.leaks:
        failures.append("it leaks GPU memory")
    if failures:
        findings = "\n".join("  " + str(f) for f in t.findings) or "  (no findings)"
        pytest.fail("oomtrace: %s\nfindings of the test:\n%s\ntrace: %s (report --since-mark %s; "
                    "removed when the session ends unless kept with oomtrace.trace(output=))"
                    % ("; ".join(failures), findings, t.path, t.label), pytrace=False)
    return result
