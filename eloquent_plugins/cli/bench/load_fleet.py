"""``eloquent bench load --restart-every S``: the load against a fleet that is being redeployed.

``--replicas N`` ``eloquent serve`` replicas share one real redis-server (the resume store) behind one real nginx,
set up as docs/DEPLOY.md says: HTTP on TCP to an ``upstream`` that retries a draining replica's ``503`` on the next
one (``proxy_next_upstream ... http_503 non_idempotent``), and UDP through the ``stream {}`` module, hashed on the
client's address and port. Every ``S`` seconds one replica gets SIGTERM (with a short ``--drain-timeout``, so that
streams still running at its deadline are handed over and migrate to another replica), the run waits until it has
exited, starts it again on the same ports, waits until ``/ready`` answers and nginx tries it again, then goes on
to the next; the load is held until every replica was restarted once. The clients (:mod:`.load_clients`) resume
what is cut; every stream's text is still checked.
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from eloquent_plugins.cli.bench.balancer import nginx_balancer, nginx_upstream
from eloquent_plugins.cli.bench.load_config import LoadConfig
from eloquent_plugins.cli.bench.redis_server import redis_server
from eloquent_plugins.cli.bench.replica import Replica

FAIL_TIMEOUT = 2
"""nginx's UDP ``fail_timeout``: a restarted replica's closed port counted as a failure, tried again after this."""
EXIT_GRACE = 60.0
"""Seconds past its drain timeout a replica may take to exit before the run fails."""
_DRAINING = re.compile(r"draining \(SIGTERM\): .* (\d+) stream\(s\)")
_DONE = re.compile(r"drain done after \S+ s: (\d+) stream\(s\) finished, (\d+) handed over, (\d+) new request\(s\) "
                   r"refused")


@dataclass
class Fleet:
    replicas: list[Replica]
    port: int
    """nginx's TCP port (HTTP)."""
    udp_port: int
    """nginx's UDP port (HTTP/3)."""

    def pids(self) -> list[int]:
        return [r.proc.pid for r in self.replicas if r.proc is not None and r.running]


@dataclass
class Restart:
    """One replica's restart as it went, from the replica's own drain log lines."""

    replica: str
    signalled_at: float
    """Seconds from the start of the run."""
    exit_s: float = 0.0
    """SIGTERM to exit."""
    ready_s: float = 0.0
    """SIGTERM to ``/ready`` answering 200 again."""
    in_flight: int = 0
    finished: int = 0
    handed_over: int = 0
    refused: int = 0
    """New requests this replica refused while it drained (nginx sent each to another)."""
    migrated_here: float = 0.0
    """Streams this replica continued for a gone producer, before its own restart (its metric)."""


@contextlib.contextmanager
def fleet(cfg: LoadConfig) -> Iterator[Fleet]:
    """The replicas, redis-server and nginx, started; stopped on exit (each replica killed: its figures are in)."""
    with redis_server() as store:
        args = ("--tpot", str(cfg.tpot), "--ttft", str(cfg.ttft), "--drain-timeout", str(cfg.drain_timeout),
                "--log-level", "warning")
        env = {"ELOQUENT_RESUME_TTL": str(cfg.resume_ttl)}
        replicas = [Replica(f"r{i}", store, args, env=env) for i in range(cfg.replicas)]
        # TCP: max_fails=0, or a restarted replica stays marked failed (by its 503s while it drained) for as long
        # as a stream through it lasts, and the next drain finds no live upstream (docs/DEPLOY.md).
        http = nginx_upstream("eloquent_http", [r.port for r in replicas], "", "max_fails=0")
        udp = nginx_upstream("eloquent_quic", [r.udp_port for r in replicas],
                             "hash $remote_addr$remote_port consistent;", f"max_fails=1 fail_timeout={FAIL_TIMEOUT}s")
        location = ("proxy_buffering off; proxy_read_timeout 1h; proxy_connect_timeout 2s; "
                    f"proxy_next_upstream error timeout http_503 non_idempotent; "
                    f"proxy_next_upstream_tries {cfg.replicas + 1};")
        try:
            for replica in replicas:
                replica.start()
            for replica in replicas:
                replica.wait_ready()
            with nginx_balancer(http, udp, target="http://eloquent_http", location=location,
                                udp_extra="proxy_timeout 60s;") as balancer:
                port = int(balancer.url.rsplit(":", 1)[1])
                yield Fleet(replicas, port, balancer.udp_port)
        finally:
            for replica in replicas:
                replica.stop()


def migrations(replica: Replica) -> float:
    """Streams ``replica`` continued for a gone producer (0 when it does not answer)."""
    try:
        return replica.metric("eloquent_migrations_total", 'outcome="migrated"')
    except Exception:  # noqa: BLE001 - a figure, never the run's failure
        return 0.0


@dataclass
class RollingRestarts:
    """A thread that restarts the fleet's replicas one after the other, ``every`` seconds apart at the least."""

    fleet: Fleet
    every: float
    drain_timeout: float
    t0: float = 0.0
    """When the load began (``time.monotonic()``): the first restart is ``every`` seconds after it."""
    restarts: list[Restart] = field(default_factory=list)
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self, t0: float) -> None:
        self.t0 = t0
        self._thread = threading.Thread(target=self._run, name="eloquent-rolling-restarts", daemon=True)
        self._thread.start()

    def went_round(self) -> bool:
        """Every replica was restarted (and is ready again) at least once."""
        return len(self.restarts) >= len(self.fleet.replicas)

    def stop(self) -> None:
        """No new restart; one under way is finished (the replica back and ready)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.drain_timeout + EXIT_GRACE + 90)

    def _run(self) -> None:
        try:
            n, next_at = 0, self.t0 + self.every
            while not self._stop.wait(max(0.0, next_at - time.monotonic())):
                replica = self.fleet.replicas[n % len(self.fleet.replicas)]
                n += 1
                signalled = time.monotonic()
                self.restarts.append(self._restart(replica, signalled))
                next_at = max(signalled + self.every, time.monotonic())
        except BaseException as exc:  # noqa: BLE001 - handed to the run, which fails with it
            self.error = exc

    def _restart(self, replica: Replica, signalled: float) -> Restart:
        done = Restart(replica.name, signalled - self.t0, migrated_here=migrations(replica))
        replica.signal(signal.SIGTERM)
        code = replica.wait_exit(self.drain_timeout + EXIT_GRACE)
        done.exit_s = time.monotonic() - signalled
        log = replica.last_log()
        if code != 0:
            raise RuntimeError(f"replica {replica.name} exited with {code} after SIGTERM:\n{log[-2000:]}")
        if (m := _DRAINING.search(log)) is not None:
            done.in_flight = int(m.group(1))
        if (m := _DONE.search(log)) is not None:
            done.finished, done.handed_over, done.refused = (int(g) for g in m.groups())
        replica.start()
        replica.wait_ready(60)
        done.ready_s = time.monotonic() - signalled
        time.sleep(FAIL_TIMEOUT + 0.5)  # nginx's UDP side tries the restarted replica again (fail_timeout)
        return done


def figures(restarts: RollingRestarts) -> dict[str, Any]:
    """The restarts as reported, with the migrations the replicas still running counted (JSON-ready)."""
    still = sum(migrations(r) for r in restarts.fleet.replicas)
    rows = [asdict(r) for r in restarts.restarts]
    return {"restarts": rows, "server_migrated": still + sum(r.migrated_here for r in restarts.restarts),
            "handed_over": sum(r.handed_over for r in restarts.restarts),
            "refused_by_draining": sum(r.refused for r in restarts.restarts)}
