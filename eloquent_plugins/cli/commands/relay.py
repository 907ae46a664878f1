"""``eloquent relay``: a lossy, delaying UDP relay on loopback (netem in user space), one path per direction.

``--loss/--burst/--delay/--jitter/--trace/--bandwidth-kbps/--loss-schedule`` set both directions (durations in
seconds; the old ``--delay-ms/--jitter-ms`` spellings still take milliseconds);
``--up-*`` (client to server) and ``--down-*`` (server to client) override one direction.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from eloquent_plugins.cli import numbers
from eloquent_plugins.cli.flags import add_ms_alias
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.sim.netem import PathConfig, load_trace, parse_loss_schedule, parse_outage
from eloquent_plugins.sim.udp_relay import RelayConfig, parse_hostport, start_relay

_PATH_OPTIONS = (
    ("loss", numbers.loss_rate, "long-run loss rate in [0, 1)"),
    ("burst", numbers.burst, "mean loss-burst length in packets (Gilbert-Elliott; 1 = independent losses)"),
    ("delay", numbers.seconds, "one-way delay in seconds"),
    ("jitter", numbers.seconds, "mean extra delay in seconds (uniform 0..2x)"),
    ("bandwidth-kbps", numbers.kbps, "bottleneck in kbit/s"),
    ("trace", str, "loss/delay trace file (format: eloquent_plugins/sim/netem/trace.py)"),
    ("loss-schedule", str, 'loss over time, "T:LOSS,T:LOSS" in seconds, e.g. "0:0.3,10:0.0"'),
)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("relay", help="lossy/delaying UDP relay for end-to-end tests",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", default="127.0.0.1:4433", metavar="HOST:PORT",
                        help="where clients send (default: %(default)s)")
    parser.add_argument("--target", required=True, metavar="HOST:PORT", help="the server to relay to")
    for prefix, label in (("", "both directions"), ("up-", "client to server"), ("down-", "server to client")):
        group = parser.add_argument_group(label)
        for name, kind, text in _PATH_OPTIONS:
            group.add_argument(f"--{prefix}{name}", type=kind, default=None,
                               help=text)
            if name in ("delay", "jitter"):
                add_ms_alias(group, f"--{prefix}{name}-ms", f"--{prefix}{name}")
    parser.add_argument("--outage", action="append", default=[], metavar="START:DURATION",
                        help="drop everything both ways from START for DURATION seconds; repeatable")
    parser.add_argument("--reorder", action="store_true",
                        help="let jitter reorder packets (default: each direction stays FIFO)")
    parser.add_argument("--seed", type=numbers.seed, default=0, help="seed of the loss and jitter draws (default: 0)")
    parser.add_argument("--duration", type=numbers.seconds, default=None, metavar="SECONDS",
                        help="stop after this long (default: until interrupted)")
    parser.set_defaults(func=run)


def _direction(args: argparse.Namespace, prefix: str, reorder: bool) -> PathConfig:
    def pick(name: str) -> object:
        own = getattr(args, f"{prefix}{name}".replace("-", "_"))
        return own if own is not None else getattr(args, name.replace("-", "_"))

    values: dict[str, object] = {"reorder": reorder}
    for name, key, scale in (("loss", "loss", 1.0), ("burst", "burst", 1.0), ("delay", "delay", 1.0),
                             ("jitter", "jitter", 1.0), ("bandwidth-kbps", "bandwidth", 1e3)):
        value = pick(name)
        if value is not None:
            values[key] = float(value) * scale  # type: ignore[arg-type]
    trace = pick("trace")
    if trace is not None:
        values["trace"] = load_trace(str(trace))
    schedule = pick("loss-schedule")
    if schedule is not None:
        values["loss_schedule"] = parse_loss_schedule(str(schedule))
    try:
        return PathConfig(**values)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ConfigError(str(exc)) from None


def build_config(args: argparse.Namespace) -> RelayConfig:

    return RelayConfig(target=parse_hostport(args.target, "--target"), listen=parse_hostport(args.listen, "--listen"),
                       upstream=_direction(args, "up_", args.reorder),
                       downstream=_direction(args, "down_", args.reorder),
                       outages=tuple(parse_outage(o) for o in args.outage), seed=args.seed)


async def _serve(config: RelayConfig, duration: float | None) -> None:
    relay = await start_relay(config)
    host, port = relay.listen_addr
    print(f"eloquent relay: {host}:{port} -> {config.target[0]}:{config.target[1]}", file=sys.stderr, flush=True)
    try:
        if duration is None:
            await asyncio.Event().wait()
        else:
            await asyncio.sleep(duration)
    finally:
        await relay.close()
        s = relay.stats
        print(f"eloquent relay: {s.clients} clients; up {s.upstream.forwarded}/{s.upstream.received} forwarded "
              f"({s.upstream.dropped} lost, {s.upstream.outage_dropped} in outages); down "
              f"{s.downstream.forwarded}/{s.downstream.received} forwarded ({s.downstream.dropped} lost, "
              f"{s.downstream.outage_dropped} in outages)", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    config = build_config(args)
    asyncio.run(_serve(config, args.duration))
    return 0


__all__ = ["register", "run", "build_config"]
