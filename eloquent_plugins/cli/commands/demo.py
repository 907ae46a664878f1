"""``eloquent demo``: the built-in engine, the HTTP/3 front end and a lossy relay, all in this process, and
the three schemes streaming the same answer side by side through the same link -- then the stall table.

On a terminal the three answers render live in columns (plain ANSI); otherwise (CI, a pipe) it prints one
progress line a second and the answers at the end. It finishes on its own in about ten seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import textwrap
import time
from dataclasses import dataclass, field
from typing import TextIO

from eloquent_plugins.cli import numbers
from eloquent_plugins.cli.flags import add_duration
from eloquent_plugins.cli.harness import (
    LABELS,
    SCHEMES,
    Conditions,
    E2EResult,
    Workload,
    add_link_arguments,
    client_for,
    format_table,
    harness,
    reference_texts,
    stream_once,
)

_PANE_LINES = 10
_GAP = 0.1
"""A render gap longer than this counts as a visible stall in the live view."""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("demo", help="watch Eloquent, retransmission and duplication stream through a lossy "
                            "link side by side", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    add_link_arguments(parser)
    parser.add_argument("--tokens", type=numbers.positive, default=None,
                        help="tokens in the answer (default: 200, --quick: 80)")
    parser.add_argument("--quick", action="store_true", help="a shorter answer (about 5 s in all)")
    add_duration(parser, "--tpot", default=0.03, old_ms="--tpot-ms", help="engine seconds per token (default: "
                 "%(default)s)")
    # Seed 1: on the default link the relay's losses fall in the streams, not on one client's handshake, so the
    # live counters tell the same story as the final table (with 7, Eloquent's first token came a PTO late).
    parser.add_argument("--seed", type=numbers.seed, default=1, help="relay loss seed (default: %(default)s)")
    parser.add_argument("--plain", action="store_true", help="no live columns even on a terminal")
    parser.set_defaults(func=run)


@dataclass(slots=True)
class _Pane:
    label: str
    text: str = ""
    tokens: int = 0
    first: float | None = None
    """When its first token rendered: a late start (a lost handshake packet) is shown as such, not as stalls."""
    last: float | None = None
    gaps: int = 0
    longest: float = 0.0
    done: bool = False
    error: str | None = None

    def add(self, delta: str, now: float) -> None:
        if self.first is None:
            self.first = now
        if self.last is not None:
            gap = now - self.last
            self.longest = max(self.longest, gap)
            if gap > _GAP:
                self.gaps += 1
        self.last = now
        self.tokens += 1
        self.text += delta


@dataclass(slots=True)
class _View:
    out: TextIO
    live: bool
    panes: dict[str, _Pane] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    _drawn: int = 0

    def status(self, pane: _Pane, now: float) -> str:
        if pane.error:
            state = "FAILED"
        elif pane.done:
            state = "done"
        elif pane.last is not None and now - pane.last > _GAP:
            state = f"stalled {now - pane.last:.1f}s"
        else:
            state = "streaming"
        first = f" (1st at {pane.first - self.started:.1f}s)" if pane.first is not None else ""
        return f"{pane.tokens} tok{first}, {pane.gaps} stalls, longest {pane.longest:.2f}s, {state}"

    def draw(self) -> None:
        now = time.monotonic()
        if not self.live:
            return
        cols = max(60, shutil.get_terminal_size((120, 24)).columns)
        width = (cols - 2 * (len(self.panes) - 1)) // len(self.panes)
        columns: list[list[str]] = []
        for pane in self.panes.values():
            lines = textwrap.wrap(pane.text, width) or [""]
            body = lines[-_PANE_LINES:] + [""] * (_PANE_LINES - len(lines[-_PANE_LINES:]))
            stalled = not pane.done and pane.last is not None and now - pane.last > _GAP
            title = pane.label[:width].ljust(width)
            status = self.status(pane, now)[:width].ljust(width)
            color = "\x1b[31m" if stalled or pane.error else "\x1b[32m" if pane.done else "\x1b[36m"
            columns.append([f"\x1b[1m{title}\x1b[0m", f"{color}{status}\x1b[0m", "-" * width]
                           + [line.ljust(width) for line in body])
        rows = ["  ".join(parts) for parts in zip(*columns)]
        if self._drawn:
            self.out.write(f"\x1b[{self._drawn}F")
        self.out.write("\n".join(f"{row}\x1b[K" for row in rows) + "\n")
        self.out.flush()
        self._drawn = len(rows)

    def tick(self) -> None:
        if self.live:
            self.draw()
            return
        now = time.monotonic()
        parts = [f"{p.label.split(' ')[0]} {p.tokens} tok/{p.gaps} stalls"
                 + (f" (1st {p.first - self.started:.1f}s)" if p.first is not None else "") for p in self.panes.values()]
        self.out.write(f"[{now - self.started:4.1f}s] " + " | ".join(parts) + "\n")
        self.out.flush()


async def _demo(conditions: Conditions, workload: Workload, view: _View) -> E2EResult:
    result = E2EResult(conditions, workload)
    for scheme in SCHEMES:
        view.panes[scheme] = _Pane(LABELS[scheme])

    def on_text(scheme: str, _request: int, delta: str) -> None:
        view.panes[scheme].add(delta, time.monotonic())

    async with harness(conditions, workload) as h:
        clients = {scheme: client_for(scheme, h.relay_url) for scheme in SCHEMES}

        async def one(scheme: str) -> None:
            run = await stream_once(h, clients[scheme], scheme, 0, workload.max_tokens, on_text)
            pane = view.panes[scheme]
            pane.done, pane.error = True, run.error
            result.streams.append(run)

        async def refresh() -> None:
            interval = 0.05 if view.live else 1.0
            while True:
                await asyncio.sleep(interval)
                view.tick()

        ticker = asyncio.create_task(refresh())
        try:
            await asyncio.gather(*(one(s) for s in SCHEMES))
        finally:
            ticker.cancel()
            for client in clients.values():
                await client.aclose()
        view.draw()
        result.references = await reference_texts(h, workload)
    result.elapsed = time.monotonic() - view.started
    result.score()
    result.streams.sort(key=lambda s: SCHEMES.index(s.scheme))
    return result


def run(args: argparse.Namespace) -> int:
    if args.tokens is None:
        args.tokens = 80 if args.quick else 200
    conditions = Conditions(loss=args.loss, burst=args.burst, rtt=args.rtt, seed=args.seed)
    conditions.path()
    workload = Workload(requests=1, max_tokens=args.tokens, ttft=0.2, tpot=args.tpot)
    out = sys.stdout
    live = out.isatty() and not args.plain and os.environ.get("TERM") != "dumb"
    out.write(f"eloquent demo: built-in engine -> HTTP/3 front end -> relay ({conditions.loss:.0%} loss, mean "
              f"burst {conditions.burst:g}, RTT {conditions.rtt * 1000:.0f} ms) -> three clients, same answer\n\n")
    out.flush()
    view = _View(out, live)
    result = asyncio.run(_demo(conditions, workload, view))
    if not live:
        out.write("\n")
        for stream in result.streams:
            out.write(f"{LABELS[stream.scheme]}: {stream.text[:160]!r}{'...' if len(stream.text) > 160 else ''}\n")
    out.write("\n" + format_table(result) + "\n")
    for stream in result.streams:
        if stream.error:
            out.write(f"  {stream.scheme}: {stream.error}\n")
    summary = result.summary()
    return 0 if summary["text_identical"] and summary["all_completed"] else 1
