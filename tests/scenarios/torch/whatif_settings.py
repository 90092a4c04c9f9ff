"""Runs one whatif_*.py scenario under several PYTORCH_CUDA_ALLOC_CONF settings, each in a
process of its own, for the price of one `import torch`.

Usage: whatif_settings.py SCRIPT CONF [CONF ...]   (an empty CONF: the variable unset)

torch is imported here, before anything touches CUDA (importing it does not initialise the
driver); then, per setting, a forked child sets the variable and runs SCRIPT as __main__. The
caching allocator reads its settings when CUDA is first used, in the child, so each child is
what a fresh `python SCRIPT` under that setting is: its own driver, context and cache. Each
child prints the scenario's JSON line (whatif_common.report_peaks, which names the setting)
and leaves with os._exit, past the interpreter's teardown (pytorch#38228). A child that fails
makes this script fail with its status.
"""
import os
import runpy
import sys

import torch  # noqa: F401  (the expensive part, shared by every child)

script, settings = sys.argv[1], sys.argv[2:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
for conf in settings:
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            if conf:
                os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
            else:
                os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            sys.argv = [script]
            runpy.run_path(script, run_name="__main__")
        except BaseException as e:  # noqa: BLE001  (said, then the status says it)
            print(f"whatif_settings: {script} under '{conf}': {e!r}", file=sys.stderr)
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"whatif_settings: {script} under '{conf}': {os.waitstatus_to_exitcode(status)}")
