"""Run a snippet in a child Python and measure it: peak RSS, seconds, and what it raised. The hostile-input
tests compare a bad input's peak with a valid input's of the same kind (issue 41: within 256 MB)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from typing import Optional

MB = 1 << 20
BOUND = 256 * MB  # what a hostile input may cost over a valid one of its kind

# The peak is VmHWM, this program's own: ru_maxrss carries over through exec the RSS of the process that
# spawned it (a pytest that packed a big mirror: every child then "peaks" at the parent's size, and a bad
# input measures the same as a valid one). /proc is Linux's; elsewhere ru_maxrss, as before.
_WRAPPER = """
import json, resource, sys, time

def peak():
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

t0 = time.perf_counter()
error, bases = None, []
try:
    exec(compile(sys.argv[1], "<measured>", "exec"), {"__name__": "__measured__"})
except BaseException as exc:
    error = f"{type(exc).__name__}: {exc}"[:2000]
    bases = [f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__]
print("\\n@@measured@@" + json.dumps({"peak": peak(),
                                 "seconds": time.perf_counter() - t0, "error": error, "bases": bases}))
"""


@dataclasses.dataclass
class Measured:
    """What :func:`measure` saw: ``peak`` RSS in bytes, ``seconds``, the error's ``"Type: message"`` (None if
    none) and its classes' qualified names."""

    peak: int
    seconds: float
    error: Optional[str]
    bases: list[str]

    @property
    def colabfast_error(self) -> bool:
        """True where it raised a ``colabfast.Error``."""
        return "colabfast.errors.Error" in self.bases


def measure(code: str, timeout: float = 300, cwd: Optional[str] = None) -> Measured:
    """Run ``code`` (dedented) in a new Python, this checkout first on its path; raise AssertionError if the
    child died (killed, crashed) or took longer than ``timeout`` seconds."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _WRAPPER, textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)
    marker = done.stdout.rfind("@@measured@@")
    assert marker >= 0, f"the child ended without a word (exit {done.returncode}): {done.stderr[-2000:]}"
    return Measured(**json.loads(done.stdout[marker + len("@@measured@@"):]))
