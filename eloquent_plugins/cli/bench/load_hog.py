"""``eloquent bench load --cpu-hog N``: N processes spinning on the CPU beside the load for the whole run.

Why: on a busy machine the server, the load processes and whatever else runs share the cores, and a stream must
then still complete (late) or fail with a typed, correct error: never a spurious timeout or refusal that the same
load on the other transport does not produce (issue 28). A hog makes that contention on purpose and the same on
every run, instead of waiting for other jobs to provide it.

Each hog is a ``python -c`` busy loop (which ends by itself if the bench dies without stopping it) at the default nice level in the benchmark's own session (so in the same
scheduler autogroup as the server and the load processes: it competes with them one for one, see
:func:`.procs.stop_process`), in a process group of its own so it is killed whole. Their CPU time is read from
``/proc`` so the report says how much they really took.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

from eloquent_plugins.cli.bench.load_servers import cpu_seconds

MAX_CPU_HOG = 64
"""More spinning processes than this measures the scheduler, not the server."""

SPIN = ("import os, sys\n"
        "parent = int(sys.argv[1])\n"
        "while os.getppid() == parent:\n"
        "    for _ in range(200_000):\n"
        "        pass\n")
"""A busy loop that ends by itself once its parent is gone (a bench killed by SIGKILL or an unhandled SIGTERM
runs no cleanup; its hogs must not spin on for ever): ``getppid`` is checked every few milliseconds against the
parent's pid given on the command line (read at the hog's start instead, a parent killed while the hog was still
starting up would have been missed)."""


@dataclass
class CpuHog:
    """The running hogs; ``cpu()`` is their CPU seconds so far (summed, read from ``/proc``)."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def cpu(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.procs)

    def alive(self) -> int:
        return sum(p.poll() is None for p in self.procs)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # a busy loop has nothing to clean up
        proc.wait(30)


@contextlib.contextmanager
def cpu_hog(n: int) -> Iterator[CpuHog]:
    """``n`` spinning processes from entry to exit (none for ``n`` 0); always stopped on the way out."""
    hog = CpuHog()
    try:
        for _ in range(n):
            hog.procs.append(subprocess.Popen([sys.executable, "-S", "-c", SPIN, str(os.getpid())],
                                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL, process_group=0))
        yield hog
    finally:
        for proc in hog.procs:
            _stop(proc)
