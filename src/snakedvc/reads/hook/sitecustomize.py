"""snakedvc's read audit (snakedvc/reads): note the files under the repository this process opens
for reading, then load the sitecustomize this one hides, if any. Kept to the standard library and
to what every Python 3.8+ runs: a stage's commands may use any interpreter."""

import atexit
import json
import os
import sys
import time


def _install():
    log = os.environ.get("SNAKEDVC_READS")
    root = os.environ.get("SNAKEDVC_READS_ROOT")
    if not log or not root or not hasattr(sys, "addaudithook"):
        return
    # The repository as given and as resolved: a path is compared as the process names it (no
    # system call per open), under either spelling of the root.
    roots = tuple({os.path.abspath(root) + os.sep, os.path.realpath(root) + os.sep})
    # The kit's records, DVC's and git's, and environments inside the repository are no stage's data.
    skipped = tuple(base + name + os.sep for base in roots for name in (".git", ".dvc", ".snakedvc", ".snakemake"))
    prefixes = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    seen = {}
    handled = set()  # absolute paths already looked at: a file opened again costs a set lookup
    writing = set("wax+")

    def hook(event, args):
        if event != "open":
            return
        path, mode, flags = args
        if isinstance(mode, str):
            if writing.intersection(mode):
                return
        elif flags is not None and flags & (os.O_WRONLY | os.O_RDWR):
            return
        if isinstance(path, int) or path is None:
            return  # a file descriptor
        try:
            path = os.fsdecode(path)
        except (TypeError, ValueError):
            return
        full = os.path.abspath(path)
        if full in handled:
            return
        handled.add(full)
        if full.startswith(roots) and not full.startswith(skipped) and not full.startswith(prefixes):
            seen.setdefault(os.path.realpath(full), time.time())  # the first read is the one that matters

    def write():
        if not seen:
            return
        lines = "".join(json.dumps({"path": p, "t": t}) + "\n" for p, t in seen.items())
        with open(log, "a") as out:  # one write: processes of one stage append side by side
            out.write(lines)

    sys.addaudithook(hook)
    atexit.register(write)


def _chain():
    """The sitecustomize.py this one shadows (Debian ships one), loaded as Python would have."""
    here = os.path.dirname(os.path.abspath(__file__))
    this = sys.modules.pop("sitecustomize", None)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        import sitecustomize  # noqa: F401
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        # Python's import of this module takes it back out of sys.modules once it has run.
        if this is not None:
            sys.modules["sitecustomize"] = this


_install()
_chain()
