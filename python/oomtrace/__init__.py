"""oomtrace for Python programs: per-tensor tracing of PyTorch, step markers.

    import oomtrace
    oomtrace.install()          # every tensor is traced, PyTorch's allocator stays in place
    for batch in loader:
        with oomtrace.step():   # or call oomtrace.mark_step() once per iteration
            train(batch)

`install()` loads liboomtrace (already there under `oomtrace run` or LD_PRELOAD; otherwise
found through OOMTRACE_LIB, next to the `oomtrace` binary on PATH, or where `pip install
oomtrace` put it), sees every tensor with its Python stack, and marks a step after every
optimizer step (until the program marks its own steps with `mark_step()` / `step()`). After
each step marker, once PyTorch has initialised CUDA, PyTorch's own memory statistics of each
device it used (`torch.cuda.memory_allocated()`, `max_memory_allocated()`,
`memory_reserved()`) go with it (`oomtrace_torch_memory`), whatever traces the tensors.
The trace goes where the library sends it: the collector of `oomtrace run`, or one the library
starts itself (see OOMTRACE_SOCKET and OOMTRACE_OUTPUT in docs/configuration.md).

Two ways to see tensors (`allocator=`):
- "tracker" (the default): oomtrace's allocator trace tracker is attached to PyTorch's own
  caching allocator as soon as PyTorch initialises CUDA (`oomtrace_torch_attach`). PyTorch keeps
  its caching and its statistics: torch.cuda.memory_allocated(), memory_summary() and friends
  work unchanged.
- "swap": PyTorch allocates through oomtrace's pluggable-allocator entry points
  `oomtrace_malloc` / `oomtrace_free` (memory from CUDA's stream-ordered pool). Caveats of the
  pluggable allocator (PyTorch's, not ours): torch.cuda.memory_stats() and friends raise, and
  cudnn.benchmark, CUDA IPC and cudagraph trees are not supported (docs/pytorch.md). Only
  for PyTorch builds the tracker cannot attach to.

Nothing here takes the GIL from a CUDA call or changes what PyTorch computes.
"""

import contextlib
import ctypes
import importlib
import os
import shutil
import sys
import warnings

__all__ = ["install", "mark_step", "step", "flush", "set_rank", "library", "library_path",
           "trace", "start", "stop", "Trace", "Finding", "OomtraceError"]

_LIB_NAME = "liboomtrace.so"
_lib = None
_lib_path = None
_step_hook = None
# Set once the program marks its own steps (or a mark failed): the optimizer hook marks
# nothing from then on and is never installed again in this process.
_optimizer_marks_stopped = False
# Set once reading or sending PyTorch's memory statistics after a step marker failed: they are
# not read again in this process (the marks go on).
_torch_memory_stopped = False
_allocator_installed = False
# The tracker: None (not asked), "queued" (attached when PyTorch initialises CUDA), True
# (attached) or why it did not attach (a phrase).
_tracker = None


def _loaded_path():
    """The path of liboomtrace if it is already mapped into this process (LD_PRELOAD)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[-1]
                if path.endswith("/" + _LIB_NAME):
                    return path
    except OSError:
        pass
    return None


def library_path():
    """Where liboomtrace is: loaded already, OOMTRACE_LIB, beside `oomtrace` on PATH, or in
    this interpreter's scripts directory (where `pip install oomtrace` puts it, beside the
    binary: found also when the environment is not activated)."""
    found = _loaded_path() or os.environ.get("OOMTRACE_LIB")
    if not found:
        exe = shutil.which("oomtrace")
        if exe:
            candidate = os.path.join(os.path.dirname(os.path.realpath(exe)), _LIB_NAME)
            if os.path.exists(candidate):
                found = candidate
    if not found:
        import sysconfig

        candidate = os.path.join(sysconfig.get_path("scripts"), _LIB_NAME)
        if os.path.exists(candidate):
            found = candidate
    if not found:
        raise RuntimeError(
            "oomtrace: cannot find liboomtrace.so (run under `oomtrace run`, or set "
            "OOMTRACE_LIB to its path)"
        )
    return found


def library():
    """liboomtrace as a ctypes library (loaded once, globally)."""
    global _lib, _lib_path
    if _lib is None:
        _lib_path = library_path()
        lib = ctypes.CDLL(_lib_path, mode=ctypes.RTLD_GLOBAL)
        lib.oomtrace_mark.argtypes = [ctypes.c_char_p]
        lib.oomtrace_mark.restype = None
        lib.oomtrace_flush.argtypes = []
        lib.oomtrace_flush.restype = ctypes.c_int
        if hasattr(lib, "oomtrace_set_rank"):  # absent from libraries older than ranks
            lib.oomtrace_set_rank.argtypes = [ctypes.c_int] * 3
            lib.oomtrace_set_rank.restype = ctypes.c_int
        if hasattr(lib, "oomtrace_torch_memory"):  # absent from older libraries
            lib.oomtrace_torch_memory.argtypes = [ctypes.c_int] + [ctypes.c_uint64] * 3
            lib.oomtrace_torch_memory.restype = ctypes.c_int
        _lib = lib
    return _lib


def mark_step(label=None):
    """Ends a step (one training iteration): the leak detector compares steps.

    Once the program marks its own steps, the optimizer step hook (`oomtrace run`,
    `install()`) stops marking, so that each iteration is one step, not two.
    """
    _stop_optimizer_marks()
    _mark(label)
    _send_torch_memory()


def _mark(label=None):
    library().oomtrace_mark(None if label is None else str(label).encode())


def _send_torch_memory():
    """After a step marker: PyTorch's own statistics of each device it has used
    (`torch.cuda.memory_allocated(d)`, `max_memory_allocated(d)`, `memory_reserved(d)`), sent
    with `oomtrace_torch_memory`, so that the trace knows allocated against reserved in every
    mode (also without tensors traced). Only when the program imported torch and PyTorch
    initialised CUDA (never initialised for this), and not under the swapped allocator (its
    statistics raise; oomtrace sees the tensors there). Peak statistics are read, never reset.
    Never raises: a failure stops the readings and says so once."""
    global _torch_memory_stopped
    if _torch_memory_stopped or _allocator_installed:
        return
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        cuda = torch.cuda
        if not cuda.is_initialized():
            return
        send = getattr(library(), "oomtrace_torch_memory", None)
        if send is None:  # a library older than the readings
            _torch_memory_stopped = True
            return
        for device in range(cuda.device_count()):
            # One dict per device: memory_allocated(d), max_memory_allocated(d) and
            # memory_reserved(d) each read these keys of it.
            stats = cuda.memory_stats(device)
            allocated = int(stats.get("allocated_bytes.all.current", 0))
            peak = int(stats.get("allocated_bytes.all.peak", 0))
            reserved = int(stats.get("reserved_bytes.all.current", 0))
            if peak == 0 and reserved == 0 and not stats.get("reserved_bytes.all.peak", 0):
                continue  # a device PyTorch never allocated on
            send(device, allocated, peak, reserved)
    except Exception as e:
        _torch_memory_stopped = True
        print("oomtrace: PyTorch's memory statistics are no longer sent with step markers "
              "(%s: %s)" % (type(e).__name__, e), file=sys.stderr)


@contextlib.contextmanager
def step(label=None):
    """A region that is one step: marks the step's end when the region ends."""
    try:
        yield
    finally:
        mark_step(label)


def flush():
    """Waits (at most 2 s) until everything recorded so far has reached the collector."""
    return library().oomtrace_flush() == 0


def set_rank(rank, world_size=None, local_rank=None):
    """Says this process's rank in a distributed job, for reports and metrics.

    Launchers that set RANK/WORLD_SIZE (torchrun, Slurm, mpirun) need nothing: the library
    reads them when the process starts. For `torch.multiprocessing.spawn`, which passes the rank
    as an argument, `torch.distributed.init_process_group` calls this by itself under
    `oomtrace run`, LD_PRELOAD or `install()`. Returns True if the rank was sent.
    """
    lib = library()
    if not hasattr(lib, "oomtrace_set_rank"):
        return False
    unknown = -1
    return lib.oomtrace_set_rank(
        int(rank),
        unknown if local_rank is None else int(local_rank),
        unknown if world_size is None else int(world_size),
    ) == 0


def _install_rank_hook(torch):
    """Wraps torch.distributed.init_process_group so that the rank it was given reaches the
    trace (see `set_rank`). None once wrapped, or when PyTorch has no torch.distributed."""
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available():
        return None
    original = dist.init_process_group
    if getattr(original, "_oomtrace_rank_hook", False):
        return None

    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        try:
            local = os.environ.get("LOCAL_RANK", "")
            set_rank(dist.get_rank(), dist.get_world_size(),
                     int(local) if local.isdigit() else None)
        except Exception:  # never break the user's init_process_group
            pass
        return result

    init_process_group.__wrapped__ = original
    init_process_group.__doc__ = original.__doc__
    init_process_group._oomtrace_rank_hook = True
    dist.init_process_group = init_process_group
    return None


def _install_allocator(torch):
    """None once PyTorch allocates through oomtrace; otherwise why it does not (a phrase)."""
    global _allocator_installed
    if _allocator_installed:
        return None
    try:
        if torch.cuda.is_initialized():
            return ("CUDA was already initialised, and PyTorch cannot swap an allocator in "
                    "use")
        library()
        allocator = torch.cuda.memory.CUDAPluggableAllocator(
            _lib_path, "oomtrace_malloc", "oomtrace_free"
        )
        torch.cuda.memory.change_current_allocator(allocator)
    except Exception as e:  # any failure leaves PyTorch's own allocator in place
        return "%s: %s" % (type(e).__name__, e)
    _allocator_installed = True
    return None


# PyTorch releases whose caching allocator oomtrace's tracker was checked against: their
# exported symbols, and their TraceEntry layout compiled against their own headers
# (docs/pytorch-releases.md, whose table says where each was tested end to end).
_CHECKED_RELEASES = frozenset((2, minor) for minor in range(4, 16))
_CHECKED_SPAN = "2.4 to 2.15"


def _release(torch):
    """(major, minor) of torch.__version__ ("2.8.0+cu128" -> (2, 8)), or None."""
    parts = str(getattr(torch, "__version__", "")).split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def _abi_unknown(torch):
    """None when the tracker may attach to this PyTorch's allocator: a release in
    `_CHECKED_RELEASES`, or another whose own headers declare the allocator's TraceEntry as
    oomtrace reads it; otherwise why not (a phrase)."""
    release = _release(torch)
    if release in _CHECKED_RELEASES:
        return None
    include = os.path.join(os.path.dirname(getattr(torch, "__file__", "") or "."), "include")
    from oomtrace._abi import trace_entry_layout  # read only for a release not checked

    layout, why = trace_entry_layout(include)
    if layout is None:
        return ("oomtrace was checked on PyTorch %s, and this release's headers do not "
                "declare the allocator's trace entries as oomtrace reads them: %s"
                % (_CHECKED_SPAN, why))
    return None


def _attach_tracker_now(torch):
    """None once oomtrace's trace tracker is attached to PyTorch's allocator; else why not."""
    backend = torch.cuda.memory.get_allocator_backend()
    if backend != "native":
        return ("PyTorch's allocator backend is %r, and the tracker attaches to the native "
                "caching allocator only" % backend)
    why = _abi_unknown(torch)
    if why:
        return why
    lib = library()
    attach = lib.oomtrace_torch_attach
    attach.argtypes = []
    attach.restype = ctypes.c_char_p
    why = attach()
    if why is None:
        _observe_out_of_memory(torch, lib)
    return None if why is None else why.decode(errors="replace")


def _observe_out_of_memory(torch, lib):
    """Registers PyTorch's out-of-memory observer, which its caching allocator calls on the
    thread that asked, just before it raises OutOfMemoryError, with what it was allowed to
    reserve: under `set_per_process_memory_fraction` the allocator refuses before the driver
    does, and this is the only word of that OOM (and of the cap). PyTorch releases its
    allocator's lock before it calls observers and takes the GIL for them itself (only at an
    OOM); the observer makes one ctypes call into liboomtrace and never raises. Silent when
    this PyTorch or library has no observer: the driver's refusals are still seen."""
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    said = getattr(lib, "oomtrace_torch_out_of_memory", None)
    if attach is None or said is None:
        return
    said.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64]
    said.restype = ctypes.c_int

    def observer(device, segment, allowed, free):
        # Raising here would replace the user's OutOfMemoryError with our exception.
        try:
            said(int(device), max(int(segment), 0), max(int(allowed), 0), max(int(free), 0))
        except Exception:
            pass

    try:
        attach(observer)
    except Exception:
        pass


def _tracker_failed(why, torch):
    """The line that says tensors are not traced: the PyTorch release, why, what instead."""
    return ("PyTorch %s: tensors are not traced, PyTorch's allocator has no oomtrace trace "
            "tracker (%s): tracing CUDA allocations (segments, not tensors); `--torch=swap` / "
            "install(allocator=\"swap\") swaps the allocator instead"
            % (getattr(torch, "__version__", "?"), why))


def _install_tracker(torch):
    """None once the tracker is attached, or queued to attach right after PyTorch
    initialises CUDA (its caching allocator exists from then on); otherwise why not."""
    global _tracker
    if _tracker is True or _tracker == "queued":
        return None
    try:
        # Decided before CUDA starts: an allocator oomtrace cannot read is never attached to.
        why = _abi_unknown(torch)
        if why:
            _tracker = why
            return why
        library()
        if torch.cuda.is_initialized():
            why = _attach_tracker_now(torch)
            _tracker = why or True
            return why
    except Exception as e:
        _tracker = "%s: %s" % (type(e).__name__, e)
        return _tracker

    def attach():
        # Runs inside torch.cuda's lazy init: it must never raise (PyTorch would turn that
        # into an error of the user's first CUDA call).
        global _tracker
        try:
            why = _attach_tracker_now(torch)
        except Exception as e:
            why = "%s: %s" % (type(e).__name__, e)
        _tracker = why or True
        if why:
            print("oomtrace: " + _tracker_failed(why, torch), file=sys.stderr)

    _tracker = "queued"
    torch.cuda._lazy_call(attach)
    return None


def _on_optimizer_step(optimizer, args, kwargs):
    # Runs inside optimizer.step(), in Python with the GIL held like the rest of the step; the
    # mark is a ctypes call into liboomtrace (no CUDA call, no hook). It must never break the
    # user's training: a failure stops the marks and says so once.
    if _optimizer_marks_stopped:
        return
    try:
        _mark()
    except Exception as e:
        _stop_optimizer_marks()
        print("oomtrace: optimizer steps are no longer marked (%s: %s)" % (type(e).__name__, e),
              file=sys.stderr)
        return
    _send_torch_memory()


def _stop_optimizer_marks():
    """The program marks its own steps (or marking failed): the optimizer hook stops marking.

    It stays registered, as a no-op: this may run while PyTorch iterates over its step hooks
    (a mark made from another step hook, or from ours failing), and removing one then would
    raise in the user's optimizer.step().
    """
    global _optimizer_marks_stopped
    _optimizer_marks_stopped = True


def _install_step_hook(torch):
    """None once every optimizer step marks a step (or the program marks its own steps);
    otherwise why not (a phrase)."""
    global _step_hook
    if _step_hook is not None or _optimizer_marks_stopped:
        return None
    try:
        library()
    except RuntimeError as e:
        return str(e).replace("oomtrace: ", "", 1)
    try:
        # torch.optim's __init__ deletes its `optimizer` name (PyTorch 2.x), so the submodule
        # is not an attribute of torch.optim: ask the import system for it.
        module = importlib.import_module("torch.optim.optimizer")
    except Exception as e:
        return "cannot import torch.optim.optimizer (%s: %s)" % (type(e).__name__, e)
    register = getattr(module, "register_optimizer_step_post_hook", None)
    if register is None:
        return ("PyTorch %s has no torch.optim.optimizer.register_optimizer_step_post_hook "
                "(PyTorch 2.0 added it)" % getattr(torch, "__version__", "?"))
    try:
        _step_hook = register(_on_optimizer_step)
    except Exception as e:
        return "register_optimizer_step_post_hook failed (%s: %s)" % (type(e).__name__, e)
    return None


def _allocator_mode(allocator):
    """"tracker", "swap" or None from install()'s `allocator` argument."""
    if allocator is True or allocator == "tracker":
        return "tracker"
    if allocator == "swap":
        return "swap"
    if allocator in (False, None):
        return None
    raise ValueError("allocator must be \"tracker\", \"swap\" or False, not %r" % (allocator,))


def install(allocator="tracker", step_hook=True):
    """Traces this process's tensors through oomtrace (imports torch if it is installed).

    allocator: "tracker" (default; True means the same): attach oomtrace's trace tracker to
    PyTorch's caching allocator, which keeps its caching and statistics; "swap": make PyTorch
    allocate through oomtrace's pluggable allocator (statistics raise); False: neither.
    step_hook: mark a step after every optimizer step (until the program marks its own).
    Returns True if tensors are traced (for the tracker: attached, or to be attached when
    PyTorch initialises CUDA). What did not work is said in a warning.
    """
    mode = _allocator_mode(allocator)
    library()
    try:
        import torch
    except ImportError:
        return False
    try:
        _install_rank_hook(torch)
        _register_exit_wait()
    except Exception:  # the rank is a label; tracing works without it
        pass
    if mode == "tracker":
        why = _install_tracker(torch)
        if why:
            warnings.warn("oomtrace: " + _tracker_failed(why, torch), stacklevel=2)
    if mode == "swap":
        why = _install_allocator(torch)
        if why:
            warnings.warn(
                "oomtrace: PyTorch's allocator was not swapped (%s): tracing stays at the CUDA "
                "level (segments, not tensors). Call oomtrace.install() before the first CUDA "
                "use, or use `oomtrace run --torch`." % why,
                stacklevel=2,
            )
    if step_hook:
        why = _install_step_hook(torch)
        if why:
            warnings.warn(
                "oomtrace: optimizer steps are not marked (%s); call oomtrace.mark_step() once "
                "per iteration." % why,
                stacklevel=2,
            )
    if mode == "tracker":
        return _tracker is True or _tracker == "queued"
    return mode == "swap" and _allocator_installed


# How long the interpreter's exit waits (the GIL released) for PyTorch's autograd threads.
_AUTOGRAD_EXIT_WAIT_S = 0.05


def _autograd_threads_alive():
    """Whether PyTorch's autograd worker threads (native threads named `pt_autograd_N`,
    unknown to `threading`) run in this process."""
    try:
        for tid in os.listdir("/proc/self/task"):
            with open("/proc/self/task/%s/comm" % tid) as f:
                if f.read().startswith("pt_autograd"):
                    return True
    except OSError:
        pass
    return False


_exit_wait_registered = False


def _register_exit_wait():
    """Registers `_let_autograd_threads_finish` at exit, once."""
    global _exit_wait_registered
    if not _exit_wait_registered:
        import atexit

        atexit.register(_let_autograd_threads_finish)
        _exit_wait_registered = True


def _let_autograd_threads_finish():
    """At exit, before the interpreter finalizes: an autograd worker thread that has just
    finished a backward pass still drops its graph task, whose thread-local state holds a
    Python object, and takes the GIL for that decref. If the interpreter is already
    finalizing, Python ends that thread (pthread_exit through C++ frames that do not allow it)
    and the process aborts: "terminate called without an active exception", exit 134
    (pytorch#38228). A traced backward pass leaves that thread a little later than an untraced
    one, enough to make the race likely: the GIL is released here for a moment so that the
    thread finishes first. Only where autograd threads exist; it never raises."""
    try:
        if _autograd_threads_alive():
            import time

            time.sleep(_AUTOGRAD_EXIT_WAIT_S)
    except Exception:
        pass


def _on_torch_import(torch, swap=False, steps=True, tracker=False):
    """Called by the sitecustomize of `oomtrace run` right after `import torch` finished.

    tracker: `--torch` (oomtrace's trace tracker on PyTorch's allocator, attached when PyTorch
    initialises CUDA); swap: `--torch=swap` (PyTorch allocates through oomtrace); steps:
    mark a step after every optimizer step. Silent when everything asked for worked; otherwise
    one line on stderr that says what works and what does not, and why. Never raises into the
    user's `import torch`.
    """
    def attempt(install):
        try:
            return install(torch)
        except Exception as e:
            return "%s: %s" % (type(e).__name__, e)

    # Registered after torch's own: runs before them, before the interpreter finalizes.
    _register_exit_wait()
    # Silent: a program without torch.distributed loses nothing.
    attempt(_install_rank_hook)
    no_tracker = attempt(_install_tracker) if tracker else None
    no_allocator = attempt(_install_allocator) if swap else None
    no_steps = attempt(_install_step_hook) if steps else None
    if not (no_tracker or no_allocator or no_steps):
        return
    if swap or tracker:
        if no_tracker:
            said = _tracker_failed(no_tracker, torch)
        elif no_allocator:
            said = ("--torch=swap: PyTorch's allocator was not swapped (%s): tracing CUDA "
                    "allocations (segments, not tensors)" % no_allocator)
        elif swap:
            said = "--torch=swap: PyTorch allocates through oomtrace (tensors are traced)"
        else:
            said = ("oomtrace's tracker is attached to PyTorch's allocator when CUDA starts "
                    "(tensors are traced)")
        if steps:
            if no_steps:
                said += ("; optimizer steps are not marked (%s): steps are found "
                         "automatically" % no_steps)
            else:
                said += "; a step is marked after every optimizer step"
    else:
        said = "optimizer steps are not marked (%s): steps are found automatically" % no_steps
    print("oomtrace: " + said, file=sys.stderr)


# The Python API: a block of this process traced, its findings as objects (`_session.py`),
# imported when first used: a program traced by `oomtrace run` (whose sitecustomize imports
# this package) does not pay for its imports (subprocess, tempfile, json) unless it asks.
def trace(output=None):
    """A block to trace: `with oomtrace.trace() as t:` (see `oomtrace._session`)."""
    from oomtrace._session import trace as _trace

    return _trace(output)


def start(output=None):
    """Starts tracing a block; `stop()` ends it and returns its `Trace`."""
    from oomtrace._session import start as _start

    return _start(output)


def stop():
    """Ends the block `start()` began; returns its `Trace`, with the report."""
    from oomtrace._session import stop as _stop

    return _stop()


def __getattr__(name):
    if name in ("Trace", "Finding", "OomtraceError"):
        from oomtrace import _session

        return getattr(_session, name)
    raise AttributeError("module 'oomtrace' has no attribute %r" % name)
