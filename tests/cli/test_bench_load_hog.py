"""``eloquent bench load --cpu-hog N`` (issue 28): the hogs really run beside the load and are gone after it (even
when the bench dies without stopping them), and a short run with them has no error on either transport."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from eloquent_plugins.cli.bench import load, load_hog


def _hogs(pid: int) -> list[int]:
    """Live hog processes (their command line is ``load_hog.SPIN``) whose parent is ``pid``, from ``/proc``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) != pid or fields[0] == "Z":
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if load_hog.SPIN.encode() in f.read():
                    out.append(int(entry))
        except OSError:
            continue
    return out


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_load_with_a_cpu_hog_has_no_errors_on_either_transport(tmp_path, capsys) -> None:
    out = tmp_path / "load.json"
    rc = load.main(["--sse", "16", "--h3", "6", "--h3-connections", "2", "--duration", "5", "--ramp", "1",
                    "--tpot", "0.05", "--ttft", "0.05", "--max-tokens", "12", "--resume-ttl", "1",
                    "--sample-interval", "0.5", "--cpu-hog", "2", "--json", str(out)])
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert rc == 0 and result["errors"] == 0, (result["sse"]["examples"], result["h3"]["examples"])
    for kind in ("sse", "h3"):
        r = result[kind]
        assert r["completed"] > 0 and not r["errors"] and r["lost"] == r["refused"] == 0, r
        assert r["started"] == r["completed"] + r["cancelled"]
    c = result["contention"]
    assert c["processes"] == 2 and result["config"]["cpu_hog"] == 2
    assert c["cpu_share"] > 0  # they ran: CPU time read from /proc
    assert "2 CPU hog processes beside it" in printed and "contention: 2 CPU hog processes" in printed
    assert all("udp_queue" in s and "udp_drops" in s for s in result["samples"])
    assert "udp_queue_kib" in result and result["udp_drops"] >= 0
    assert not _hogs(os.getpid())  # every hog stopped with the run


def test_hogs_end_by_themselves_when_the_bench_is_killed() -> None:
    """SIGKILL runs no cleanup: the hogs see their parent gone and stop spinning."""
    script = ("import time\nfrom eloquent_plugins.cli.bench.load_hog import cpu_hog\n"
              "with cpu_hog(2) as hog:\n    print(*(p.pid for p in hog.procs), flush=True)\n    time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and not any(_gone(p) for p in pids)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
    deadline = time.monotonic() + 60
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in pids if not _gone(p)]
    for pid in left:  # do not leave them spinning if the check fails
        os.kill(pid, signal.SIGKILL)
    assert not left, f"hogs still running after their parent was killed: {left}"


def test_cpu_hog_context_runs_and_stops_them() -> None:
    with load_hog.cpu_hog(1) as hog:
        assert hog.alive() == 1 and _hogs(os.getpid()) == [hog.procs[0].pid]
        pid = hog.procs[0].pid
    assert hog.alive() == 0 and _gone(pid)
    with load_hog.cpu_hog(0) as none:
        assert none.procs == [] and none.cpu() == 0


def test_cpu_hog_option_is_bounded() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    load.add_arguments(parser)
    assert load.config_from_args(parser.parse_args([])).cpu_hog == 0
    assert load.config_from_args(parser.parse_args(["--cpu-hog", "3"])).cpu_hog == 3
    assert load.config_from_args(parser.parse_args(["--cpu-hog", "3", "--quick"])).cpu_hog == 3
    for bad in ("-1", "1.5", str(load_hog.MAX_CPU_HOG + 1)):
        with pytest.raises(SystemExit):
            parser.parse_args(["--cpu-hog", bad])
