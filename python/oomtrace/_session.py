"""Tracing a block of a running Python program, and its findings as Python objects.

    with oomtrace.trace() as t:
        train_a_few_steps()
    t.findings            # [Finding(kind='leak', level='confirmed', where='train.py:42', ...)]
    print(t.report())     # the text `oomtrace report` prints
    t.json()              # the `--json` document
    t                     # in Jupyter: the HTML view, inline

The first block loads liboomtrace into the process (`install()`: every PyTorch tensor with its
Python line) and the library starts a collector for the process, writing its trace into a
directory of its own (removed at exit, unless `output=` names where to keep it). Each block
is marked in that trace by a step marker with a label of its own; its report is `oomtrace
report TRACE --since-mark LABEL` made when the block ends: findings and "what the memory is"
cover the block; what the process held before it counts in the device's totals and is never a
finding of the block. A block is also a step boundary (where the optimizer's step hook marks
steps, those go on).

Nothing here takes the GIL in a CUDA call or changes what PyTorch computes: the marks are the
library's `oomtrace_mark`, the report is made by the `oomtrace` binary in a child process.
"""

import atexit
import html
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile

# The directory the library's own collector writes the trace into, when this module chose it.
_own_dir = None
# The trace file, once known.
_trace_path = None
_blocks = itertools.count(1)
# How long making a report may take (a child `oomtrace report`).
_REPORT_TIMEOUT_S = 120


class OomtraceError(RuntimeError):
    """A report could not be made (the reason is the message)."""


def _binary():
    """The `oomtrace` binary: OOMTRACE_COLLECTOR, beside liboomtrace, or on PATH."""
    from oomtrace import library_path

    exe = os.environ.get("OOMTRACE_COLLECTOR")
    if exe:
        return exe
    try:
        beside = os.path.join(os.path.dirname(library_path()), "oomtrace")
        if os.access(beside, os.X_OK):
            return beside
    except RuntimeError:
        pass
    found = shutil.which("oomtrace")
    if found:
        return found
    raise OomtraceError("cannot find the `oomtrace` binary (set OOMTRACE_COLLECTOR to its path)")


def _remove_own_dir():
    if _own_dir is not None:
        shutil.rmtree(_own_dir, ignore_errors=True)


def _trace_file():
    """The trace this process's library writes, or None when another process's collector
    holds it (`oomtrace run`, OOMTRACE_SOCKET)."""
    global _trace_path
    if _trace_path is not None:
        return _trace_path
    if _own_dir is None:
        # Preloaded (LD_PRELOAD) without a collector to send to: the library's own collector
        # writes OOMTRACE_OUTPUT (default oomtrace.<pid>.oomt in the working directory it
        # started in), which this process can read as it goes.
        if os.environ.get("OOMTRACE_SOCKET"):
            # Under `oomtrace run`, which says where its trace is.
            run_trace = os.environ.get("OOMTRACE_TRACE")
            if run_trace and os.path.isfile(run_trace):
                _trace_path = run_trace
            return _trace_path
        name = os.environ.get("OOMTRACE_OUTPUT") or "oomtrace.%p.oomt"
        name = os.path.abspath(name.replace("%p", str(os.getpid())))
        if os.path.isfile(name):
            _trace_path = name
        return _trace_path
    names = sorted(n for n in os.listdir(_own_dir) if n.endswith(".oomt"))
    if names:
        _trace_path = os.path.join(_own_dir, names[0])
    return _trace_path


def _load_library(output):
    """Loads liboomtrace (once) so that it starts a collector writing where this module reads.
    Under `oomtrace run` or LD_PRELOAD it is loaded already, and its trace is not ours."""
    global _own_dir, _trace_path
    import oomtrace

    if oomtrace._lib is not None or oomtrace._loaded_path():
        return
    if os.environ.get("OOMTRACE_SOCKET") or os.environ.get("OOMTRACE_OUTPUT"):
        oomtrace.library()
        return
    if output is not None:
        output = os.path.abspath(output)
        if os.path.exists(output):
            raise OomtraceError("%s exists: oomtrace never replaces a file" % output)
        os.environ["OOMTRACE_OUTPUT"] = output
        _trace_path = output
    else:
        _own_dir = tempfile.mkdtemp(prefix="oomtrace-session-")
        os.environ["OOMTRACE_OUTPUT"] = os.path.join(_own_dir, "trace.%p.oomt")
        atexit.register(_remove_own_dir)
    oomtrace.library()
    # The library starts on its first hook (the block's mark) and reads the variable then;
    # `_started` takes it back out, so that the program's children choose their own.
    global _output_set
    _output_set = True


# Whether this module put OOMTRACE_OUTPUT in the environment for the library to read.
_output_set = False


def _started():
    global _output_set
    if _output_set:
        os.environ.pop("OOMTRACE_OUTPUT", None)
        _output_set = False


def _written(path, settle_s=0.25, most_s=3.0):
    """Waits until the collector has written what `flush()` delivered: it writes at least
    every 100 ms, so the file's size holding still for `settle_s` says so (at most `most_s`)."""
    import time

    start = time.monotonic()
    size, since = -1, start
    while time.monotonic() - start < most_s:
        try:
            now_size = os.path.getsize(path)
        except OSError:
            now_size = -1
        now = time.monotonic()
        if now_size != size:
            size, since = now_size, now
        elif now_size >= 0 and now - since >= settle_s:
            return
        time.sleep(0.05)


def _notebook_cell(filename):
    """The execution count of the IPython cell compiled under `filename`, or None."""
    ipython = sys.modules.get("IPython")
    try:
        shell = ipython.get_ipython() if ipython is not None else None
        cells = getattr(getattr(shell, "compile", None), "_filename_map", None) or {}
        return cells.get(filename)
    except Exception:
        return None


class Finding:
    """One finding of a report, as `report --json` has it (`raw`), with its main fields."""

    def __init__(self, raw):
        self.raw = raw
        self.kind = raw.get("kind")
        self.level = raw.get("level")
        self.message = raw.get("message", "")
        self.hint = raw.get("hint", "")
        self.bytes = raw.get("bytes", 0)
        self.device = raw.get("device")
        culprit = raw.get("culprit") or {}
        self.file = culprit.get("file", "")
        self.line = culprit.get("line", 0)
        self.function = culprit.get("function", "")
        self.site = raw.get("site_name", "")

    @property
    def where(self):
        """`file.py:LINE` of the user's line (`Cell In[3], line 7` for a notebook cell, as
        IPython's tracebacks say), or the call site's name."""
        if self.file and self.line:
            cell = _notebook_cell(self.file)
            if cell is not None:
                return "Cell In[%d], line %d" % (cell, self.line)
            return "%s:%d" % (os.path.basename(self.file), self.line)
        return self.site

    def __repr__(self):
        return "Finding(kind=%r, level=%r, where=%r, message=%r)" % (
            self.kind, self.level, self.where, self.message)

    def __str__(self):
        return "[%s %s] %s: %s" % (self.level, self.kind, self.where, self.message)


class Trace:
    """A block of this process traced (`with oomtrace.trace() as t:`, or `start()`/`stop()`),
    and, once it ended, its report."""

    def __init__(self, output=None):
        self._output = output
        self._label = None
        self._json = None
        self._text = None
        self._path = None

    def start(self):
        if self._label is not None:
            raise OomtraceError("this block was started already")
        import oomtrace

        _load_library(self._output)
        try:
            oomtrace.install()
        except BaseException:
            _started()
            raise
        self._label = "oomtrace.trace:%d:%d" % (os.getpid(), next(_blocks))
        try:
            oomtrace._mark(self._label)
        finally:
            _started()
        oomtrace._send_torch_memory()
        return self

    def stop(self):
        """Ends the block and makes its report (raises OomtraceError if it cannot)."""
        import oomtrace

        if self._label is None:
            raise OomtraceError("this block was never started")
        if self._path is not None:
            return self
        oomtrace._mark(self._label + ":end")
        oomtrace._send_torch_memory()
        oomtrace.flush()
        path = _trace_file()
        if path is None:
            raise OomtraceError(
                "the trace of this process is written by a collector that does not say where "
                "(OOMTRACE_SOCKET without OOMTRACE_TRACE): `oomtrace report TRACE "
                "--since-mark %s` on it gives this block's report" % self._label)
        self._path = path
        _written(path)
        text = self._report("--json")
        try:
            self._json = json.loads(text)
        except ValueError as e:
            raise OomtraceError("`oomtrace report --json` gave no JSON (%s)" % e)
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        try:
            self.stop()
        except OomtraceError as e:
            # The block's own exception, if any, is the one that matters.
            print("oomtrace: %s" % e, file=sys.stderr)
        return False

    def _report(self, *flags):
        cmd = [_binary(), "report", self._path, "--since-mark", self._label, "--no-wait",
               "--color", "never"] + list(flags)
        try:
            out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 timeout=_REPORT_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise OomtraceError("`oomtrace report` failed: %s" % e)
        if out.returncode not in (0, 1):
            raise OomtraceError("`oomtrace report` failed: %s"
                                % out.stderr.decode(errors="replace").strip())
        return out.stdout.decode(errors="replace")

    def _need(self):
        if self._json is None:
            raise OomtraceError("the block has not ended yet: its report is made by stop()")

    @property
    def path(self):
        """The trace file the block is in (the whole process's trace)."""
        return self._path

    @property
    def label(self):
        """The step marker that begins the block."""
        return self._label

    def json(self):
        """The block's `oomtrace report --json` document."""
        self._need()
        return self._json

    @property
    def findings(self):
        """The block's findings, as `Finding` objects: what the detectors found in the block
        (leaks, growth, fragmentation, out-of-memory errors). Memory still live when the block
        ended is in the report's sections, not a finding: the process goes on."""
        self._need()
        return [Finding(f) for f in self._json.get("findings", [])
                if f.get("kind") != "live_at_exit"]

    @property
    def leaks(self):
        """The findings that are leaks."""
        return [f for f in self.findings if f.kind == "leak"]

    def _peaks(self, field):
        self._need()
        peak = 0
        for p in self._json.get("processes", []):
            for d in p.get("devices", []):
                peak = max(peak, int((d.get("since_mark") or {}).get(field, 0)))
        return peak

    @property
    def peak_bytes(self):
        """The most GPU memory the process held at one moment during the block, on its
        busiest device (PyTorch's reserve and every other CUDA allocation; memory made before
        the block and still held counts: it is what decides an out-of-memory error)."""
        return self._peaks("peak_bytes")

    @property
    def tensor_peak_bytes(self):
        """The most bytes of PyTorch tensors live at one moment during the block, on its
        busiest device (`torch.cuda.max_memory_allocated()` as if reset when the block began;
        tensors made before the block and still live count)."""
        return self._peaks("tensor_peak_bytes")

    @property
    def own_tensor_peak_bytes(self):
        """How far PyTorch's tensors on one device rose above what was live when the block
        began, at their peak during it: the block's own GPU memory (what `limit` of the pytest
        plugin checks)."""
        self._need()
        peak = 0
        for p in self._json.get("processes", []):
            for d in p.get("devices", []):
                w = d.get("since_mark") or {}
                rise = int(w.get("tensor_peak_bytes", 0)) - int(w.get("tensor_bytes_at_start", 0))
                peak = max(peak, rise)
        return peak

    def report(self):
        """The block's report as `oomtrace report` prints it."""
        self._need()
        if self._text is None:
            self._text = self._report()
        return self._text

    def view_html(self):
        """The HTML view of the process's trace (one self-contained file's text)."""
        self._need()
        out_dir = tempfile.mkdtemp(prefix="oomtrace-view-")
        try:
            out = os.path.join(out_dir, "view.html")
            subprocess.run([_binary(), "view", self._path, "-o", out], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=_REPORT_TIMEOUT_S, check=True)
            with open(out, encoding="utf-8") as f:
                return f.read()
        except (OSError, subprocess.SubprocessError) as e:
            raise OomtraceError("`oomtrace view` failed: %s" % e)
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)

    def _repr_html_(self):
        if self._json is None:
            return "<pre>oomtrace: tracing (the report comes when the block ends)</pre>"
        try:
            page = self.view_html()
        except OomtraceError as e:
            return "<pre>%s</pre>" % html.escape(str(e))
        summary = "".join("<li>%s</li>" % html.escape(str(f)) for f in self.findings)
        return ('<div class="oomtrace"><ul>%s</ul><iframe srcdoc="%s" '
                'style="width:100%%;height:640px;border:0"></iframe></div>'
                % (summary or "<li>no findings</li>", html.escape(page, quote=True)))

    def __repr__(self):
        if self._json is None:
            return "<oomtrace.Trace %s>" % ("running" if self._label else "not started")
        return "<oomtrace.Trace: %d finding(s), the block's own tensors at their peak: %d " \
            "bytes>" % (len(self.findings), self.own_tensor_peak_bytes)


_current = None


def trace(output=None):
    """A block to trace: `with oomtrace.trace() as t:`. `output`: keep the process's trace
    there (a new file; default: a directory of its own, removed at exit)."""
    return Trace(output)


def start(output=None):
    """Starts tracing a block (`stop()` ends it and returns its `Trace`)."""
    global _current
    if _current is not None:
        raise OomtraceError("a block is being traced already (stop() ends it)")
    _current = Trace(output).start()
    return _current


def stop():
    """Ends the block `start()` began; returns its `Trace`, with the report."""
    global _current
    if _current is None:
        raise OomtraceError("no block is being traced (start() begins one)")
    t, _current = _current, None
    return t.stop()
