"""CPU time of live processes from ``/proc``, and which process of a vLLM server is which.

Why ``/proc`` and not wall-clock throughput: on a small shared machine tokens/s depends on who gets the cores;
the CPU a process spends per token it serves does not (much). ``/proc/PID/stat`` fields 14 and 15 (``utime``,
``stime``, in clock ticks) count every thread of the process, live or exited, so a before/after difference over a
run is the process's whole CPU for that run, whatever its thread pool did.

How a vLLM server's processes are found (vLLM 0.32/0.33, one API server): the PID we started runs the API server
itself (uvicorn, our middleware, the detokeniser's output handler) and spawns, as children, the engine core
(``setproctitle``: command line and ``comm`` ``VLLM::EngineCore``), with ``--api-server-count N`` the API servers
(``VLLM::APIServer_N``), workers (``VLLM::Worker...``) when the executor is multiprocess, and multiprocessing's
``resource_tracker`` (its command line names it). :func:`vllm_processes` walks ``/proc`` for the descendants of
the started PID (``ppid`` field of each ``/proc/PID/stat``) and sorts them by those titles.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class ProcessGone(RuntimeError):
    """A measured process exited (or never existed): its CPU time cannot be read."""


def _stat_fields(pid: int) -> tuple[str, list[str]]:
    """``comm`` and the fields after it (index 0 is ``state``) of ``/proc/PID/stat``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ProcessGone(f"process {pid} is gone") from exc
    left, right = raw.index("("), raw.rindex(")")  # comm may contain spaces and parentheses
    return raw[left + 1:right], raw[right + 2:].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads) so far."""
    _comm, fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def cmdline(pid: int) -> str:
    """The command line (``setproctitle`` shows here), or ``[comm]`` for one without (a kernel thread)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            text = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""
    return text or f"[{_stat_fields(pid)[0]}]"


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root`` (children first, breadth-first), from the ``ppid`` of each process."""
    parent: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int(_stat_fields(int(entry.name))[1][1])
            except (ProcessGone, ValueError, IndexError, OSError):
                continue
    out: list[int] = []
    frontier = [root]
    while frontier:
        children = sorted(pid for pid, ppid in parent.items() if ppid in frontier)
        out += children
        frontier = children
    return out


@dataclass
class ServerProcesses:
    """The processes of one server, by role: pid -> command line (how each was recognised is in ``how``)."""

    api: dict[int, str] = field(default_factory=dict)
    engine: dict[int, str] = field(default_factory=dict)
    other: dict[int, str] = field(default_factory=dict)
    how: str = ""

    def roles(self) -> dict[str, list[int]]:
        return {"api": sorted(self.api), "engine": sorted(self.engine)}


ENGINE_TITLES = ("VLLM::EngineCore", "VLLM::Worker", "VLLM::DPEngineCore")
API_TITLE = "VLLM::APIServer"


def vllm_processes(root: int) -> ServerProcesses:
    """Sort a vLLM server's processes (``root``: the PID we started) into API server(s) and engine."""
    out = ServerProcesses()
    children = {pid: cmdline(pid) for pid in descendants(root)}
    for pid, text in children.items():
        if text.startswith(ENGINE_TITLES):
            out.engine[pid] = text
        elif text.startswith(API_TITLE):
            out.api[pid] = text
        else:
            out.other[pid] = text
    if out.api:
        out.how = f"API servers: children titled {API_TITLE}*"
    else:
        out.api[root] = cmdline(root)
        out.how = "API server: the started process itself (one API server runs in the launcher)"
    out.how += f"; engine: descendants titled {' / '.join(ENGINE_TITLES)}"
    if not out.engine:
        raise ProcessGone(f"no engine process ({', '.join(ENGINE_TITLES)}) among the descendants of {root}: "
                          f"{children}")
    return out


def thread_ns(pid: int) -> dict[int, int]:
    """On-CPU nanoseconds of each live thread of ``pid`` (``/proc/PID/task/TID/schedstat``, first field)."""
    out: dict[int, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError as exc:
        raise ProcessGone(f"process {pid} is gone") from exc
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
            continue
    return out


TICK_SLACK_S = 3 / CLOCK_TICKS
"""How far the precise figure may sit from the tick-based one before the tick-based one is believed."""


class CpuMeter:
    """CPU seconds of named groups of processes between :meth:`start` and :meth:`stop` (one run).

    Precise where it can be: the per-thread ``schedstat`` nanoseconds (``stat``'s ticks are 10 ms, which is
    +-10% of a 0.2 s run). A thread that exits during the run takes its time with it, so when a thread seen at
    the start is gone at the end, or the two figures disagree by more than 3 ticks + 2%, the tick-based
    difference (which keeps exited threads' time) is used for that process and run.
    """

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups = {name: list(pids) for name, pids in groups.items() if pids}
        self._at: dict[int, tuple[dict[int, int], float]] = {}
        self.fallbacks = 0
        """Process-runs measured with ticks instead of nanoseconds (see the class docstring)."""

    def _pids(self) -> list[int]:
        return [pid for pids in self.groups.values() for pid in pids]

    def start(self) -> None:
        self._at = {pid: (thread_ns(pid), cpu_seconds(pid)) for pid in self._pids()}

    def _delta(self, pid: int) -> float:
        threads0, ticks0 = self._at[pid]
        threads1, ticks1 = thread_ns(pid), cpu_seconds(pid)
        ticks = ticks1 - ticks0
        precise = (sum(threads1.values()) - sum(ns for tid, ns in threads0.items() if tid in threads1)) / 1e9
        if set(threads0) - set(threads1) or abs(precise - ticks) > TICK_SLACK_S + 0.02 * ticks:
            self.fallbacks += 1
            return ticks
        return precise

    def stop(self) -> dict[str, float]:
        """CPU seconds of each group since :meth:`start`."""
        return {name: sum(self._delta(pid) for pid in pids) for name, pids in self.groups.items()}
