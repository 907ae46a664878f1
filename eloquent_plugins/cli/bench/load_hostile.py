# long: one load process runs the three hostile kinds (never-readers, fake Initials, resume storms) and reports
# them together; split, their tally and stop logic would be shared across modules
"""The hostile mix of ``eloquent bench load`` (issue 18): what a public server also gets beside its real clients.

One extra load process holds, for the whole run and never more than configured:

* **never-readers** (``--never-readers N``): raw TCP sockets with the smallest receive buffer the kernel allows
  that send the normal slots' streaming request and never read a byte. Each one seen closed (a reset, or a FIN
  with nothing left unread: a FIN behind unread bytes cannot reach a client that never reads) is replaced after a
  second, so ``N`` stay open however the server sheds them; after the run they are read out to see what it did;
* **fake Initials** (``--fake-initials-per-s R``): one UDP socket sending 1200-byte QUIC v1 Initial packets with
  random connection ids and a random (undecryptable) payload to the HTTP/3 port, ``R`` per second -- the cheapest
  way to make a QUIC server set up connection state. Whatever the server sends back (Retry, version negotiation)
  is counted, never answered;
* **resume storms** (``--resume-storm N``): SSE clients that cut every stream after a random number of events and
  resume it with ``Last-Event-ID`` (the ``id:`` of the last event they got, or the ``x-eloquent-stream`` token
  before the first), over and over until the stream ends; the reassembled text must equal the non-streamed
  answer exactly. Their mismatches and errors are reported on their own, never in the normal streams' verdict.

A server that refuses (503, 429) or sheds (reset, refused connect) any of this is counted, not an error: that is
what a defence looks like from outside. Loopback only: every address is 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import random
import socket
import struct
import termios
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from eloquent_plugins.cli.bench.load_wire import chat_body, content_delta
from eloquent_plugins.core.protocol import STREAM_HEADER

if TYPE_CHECKING:
    from eloquent_plugins.cli.bench.load_config import LoadConfig

INITIAL_SIZE = 1200
"""Bytes of every fake Initial: the minimum a server must accept for a client's first datagram (RFC 9000 14.1)."""
NEVER_READER_RCVBUF = 1024
"""Asked for ``SO_RCVBUF`` before connecting (the kernel raises it to its minimum)."""
REFUSED_STATUSES = (429, 503)
_TCP_ESTABLISHED = 1
_REPLACE_AFTER = 1.0  # seconds before a closed never-reader is replaced: bounds the reconnect rate
_PATH = "/v1/chat/completions"
STOP_SECONDS = 10.0
"""The most the hostile process waits for its tasks to end once told to stop; its final figures go out regardless."""
END_READ_SECONDS, END_READ_BYTES = 3.0, 1 << 20
"""Bounds on reading out the never-readers after the run, to see what the server did with them."""


def fake_initial(rng: random.Random | None = None) -> bytes:
    """One QUIC v1 Initial a server cannot decrypt: long header (0xc0: Initial, 1-byte packet number), version 1,
    random 8-byte DCID and SCID, no token, 2-byte length, random payload; exactly :data:`INITIAL_SIZE` bytes."""
    randbytes = rng.randbytes if rng is not None else os.urandom
    head = b"\xc0\x00\x00\x00\x01\x08" + randbytes(8) + b"\x08" + randbytes(8) + b"\x00"
    length = INITIAL_SIZE - len(head) - 2
    return head + struct.pack("!H", 0x4000 | length) + randbytes(length)


@dataclass(slots=True)
class HostileTally:
    never_opened: int = 0
    never_refused: Counter[str] = field(default_factory=Counter)
    never_closed: Counter[str] = field(default_factory=Counter)
    """Never-readers the server closed during the run, by the status line it had sent first (or ``none``)."""
    initials_sent: int = 0
    initials_not_sent: int = 0
    """Our socket would block, or the port answered ICMP unreachable."""
    initials_replies: int = 0
    initials_reply_bytes: int = 0
    initials_seconds: float = 0.0
    storm_started: int = 0
    storm_completed: int = 0
    storm_cancelled: int = 0
    storm_cuts: int = 0
    storm_resumes: list[int] = field(default_factory=list)
    """Per storm client: requests sent with Last-Event-ID."""
    storm_mismatches: int = 0
    storm_refused: Counter[str] = field(default_factory=Counter)
    storm_errors: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def note(self, counter: Counter[str], kind: str, detail: str = "") -> None:
        counter[kind] += 1
        self.examples.setdefault(kind, detail[:300])

    def line(self, held: int) -> str:
        return (f"never-readers held {held} (opened {self.never_opened}, closed by server "
                f"{sum(self.never_closed.values())}), fake Initials {self.initials_sent} (replies "
                f"{self.initials_replies}), storm streams {self.storm_completed} exact / {self.storm_mismatches} "
                f"mismatched, {sum(self.storm_resumes)} resumes, {sum(self.storm_errors.values())} errors, "
                f"{sum(self.storm_refused.values()) + sum(self.never_refused.values())} refused")


# -- never-readers -------------------------------------------------------------------------------------------------


def _request_bytes(port: int, body: dict[str, Any]) -> bytes:
    raw = json.dumps(body).encode()
    head = (f"POST {_PATH} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
            f"accept: text/event-stream\r\ncontent-length: {len(raw)}\r\n\r\n")
    return head.encode("latin-1") + raw


def _tcp_state(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]


def _unread(sock: socket.socket) -> tuple[str, int]:
    """(the status code the server sent first, or ``none``; bytes waiting unread) without reading them."""
    try:
        waiting = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
        head = sock.recv(12, socket.MSG_PEEK)
    except OSError:
        return "error", 0
    status = head[9:12].decode("latin-1") if head.startswith(b"HTTP/1.") and len(head) >= 12 else "none"
    return status, waiting


async def _never_reader(i: int, cfg: LoadConfig, port: int, request: bytes, tally: HostileTally,
                        held: dict[int, socket.socket], stop: asyncio.Event) -> None:
    """Slot ``i``: keep one never-reading connection open, replacing it whenever the server closes it.

    Every loop here also checks ``stop``: on Python 3.11 ``asyncio.wait_for`` can swallow a cancellation that
    lands as its inner future completes, and a ``while True`` would then run on after the parent said stop."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(cfg.ramp * i / max(1, cfg.never_readers))
    while not stop.is_set():
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, NEVER_READER_RCVBUF)  # before connect: the window
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), 10)
            await asyncio.wait_for(loop.sock_sendall(sock, request), 10)
        except (OSError, TimeoutError) as exc:
            sock.close()
            tally.note(tally.never_refused, f"never-reader {type(exc).__name__}", str(exc))
            await asyncio.sleep(_REPLACE_AFTER)
            continue
        tally.never_opened += 1
        held[i] = sock
        try:
            while _tcp_state(sock) == _TCP_ESTABLISHED:
                if stop.is_set():
                    return  # still held: read out by _never_readers_at_end
                await asyncio.sleep(1.0)
            closed_as = _unread(sock)[0]
        except OSError as exc:
            closed_as = type(exc).__name__
        tally.never_closed[closed_as] += 1
        del held[i]
        sock.close()
        await asyncio.sleep(_REPLACE_AFTER)


async def _never_readers_at_end(held: dict[int, socket.socket]) -> dict[str, Any]:
    """The still-held never-readers once the run is over: the status and the bytes each had waiting unread, then
    what became of each, read out for at most :data:`END_READ_SECONDS` (a client that never reads sees only a
    reset: the server's FIN waits behind the bytes it has not read)."""
    statuses: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    unread = 0
    reading: dict[socket.socket, list[Any]] = {}  # socket -> [bytes read, last bytes]
    for sock in held.values():
        status, waiting = _unread(sock)
        statuses[status] += 1
        unread += waiting
        reading[sock] = [0, b""]
    deadline = time.monotonic() + END_READ_SECONDS
    while reading and time.monotonic() < deadline:
        for sock, entry in list(reading.items()):
            try:
                while entry[0] < END_READ_BYTES:
                    data = sock.recv(65536)
                    if not data:
                        complete = entry[1].endswith(b"0\r\n\r\n")
                        outcomes["whole response, then closed" if complete else "closed mid-response"] += 1
                        del reading[sock]
                        break
                    entry[0] += len(data)
                    entry[1] = (entry[1] + data)[-16:]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                outcomes["reset"] += 1
                del reading[sock]
        await asyncio.sleep(0.05)
    for entry in reading.values():
        outcomes["whole response, still open" if entry[1].endswith(b"0\r\n\r\n") else "still mid-response"] += 1
    for sock in held.values():
        sock.close()
    held.clear()
    return {"held": sum(statuses.values()), "statuses": dict(statuses), "unread_bytes": unread,
            "outcomes": dict(outcomes)}


# -- fake Initials -------------------------------------------------------------------------------------------------


async def _fake_initials(cfg: LoadConfig, udp_port: int, tally: HostileTally, stop: asyncio.Event) -> None:
    """``cfg.fake_initials_per_s`` fake Initials per second, paced in 10 ms steps (no catch-up burst over 1 s)."""
    loop = asyncio.get_running_loop()
    rng = random.Random()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    sock.connect(("127.0.0.1", udp_port))

    def replies() -> None:
        while True:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # ICMP unreachable from an earlier send
                tally.initials_not_sent += 1
                return
            tally.initials_replies += 1
            tally.initials_reply_bytes += len(data)

    loop.add_reader(sock.fileno(), replies)
    start = time.monotonic()
    due_sent = 0
    try:
        while not stop.is_set():
            tally.initials_seconds = time.monotonic() - start
            due = int(tally.initials_seconds * cfg.fake_initials_per_s) - due_sent
            for _ in range(min(due, int(cfg.fake_initials_per_s) + 1)):
                try:
                    sock.send(fake_initial(rng))
                    tally.initials_sent += 1
                except OSError:
                    tally.initials_not_sent += 1
            due_sent += due
            await asyncio.sleep(0.01)
    finally:
        tally.initials_seconds = time.monotonic() - start
        loop.remove_reader(sock.fileno())
        sock.close()


# -- resume storms -------------------------------------------------------------------------------------------------


class _Cut(Exception):
    """Raised from the body callback to drop the connection after the chosen number of events."""


@dataclass(slots=True)
class _StormStream:
    """One stream read over many connections: the text so far, the last event id, whether ``[DONE]`` came."""

    text: list[str] = field(default_factory=list)
    last_id: str | None = None
    token: str | None = None
    done: bool = False
    in_band_error: str | None = None
    budget: int = 0
    """Events this connection may still read before it is cut."""
    parser: Any = None

    def connection(self, budget: int) -> None:
        from eloquent_plugins.core.sse_reader import SSEParser

        self.parser, self.budget = SSEParser(), budget

    def on_piece(self, result: Any, piece: bytes) -> None:
        if result.status != 200:
            return
        self.token = self.token or result.headers.get(STREAM_HEADER)
        if self.budget <= 0:
            raise _Cut
        for message in self.parser.feed(piece):
            if not message.data:
                continue
            if message.id:
                self.last_id = message.id
            if message.data == "[DONE]":
                self.done = True
                return
            delta, in_band = content_delta(message.data)
            if in_band:
                self.in_band_error = message.data
            elif delta:
                self.text.append(delta)
            self.budget -= 1
            if self.budget <= 0:
                raise _Cut


async def _storm_stream(client: int, cfg: LoadConfig, port: int, prompt: str, expected: str, tally: HostileTally,
                        rng: random.Random, stop: asyncio.Event) -> None:
    """One storm stream from start to end; its verdict goes into ``tally``."""
    from eloquent_plugins.cli.bench.lighthttp import Connection, ResponseError

    body = json.dumps(chat_body(prompt, cfg.max_tokens, True)).encode()
    stream = _StormStream()
    deadline = time.monotonic() + 2 * (cfg.stream_seconds + cfg.read_timeout)
    most = max(1, cfg.max_tokens // 4)
    first = True
    while not stream.done:
        if stop.is_set():
            return  # the run is over: neither a verdict nor an error
        if time.monotonic() > deadline:
            tally.note(tally.storm_errors, "storm stream did not end in time")
            return
        # Now and then cut before the first event: the resume then starts from the x-eloquent-stream token.
        stream.connection(0 if first and rng.random() < 0.25 else rng.randint(1, most))
        headers = {"content-type": "application/json", "accept": "text/event-stream"}
        if not first:
            headers["last-event-id"] = stream.last_id or stream.token or ""
            tally.storm_resumes[client] += 1
        conn = Connection("127.0.0.1", port, timeout=cfg.stream_seconds + cfg.read_timeout)
        try:
            result = await conn.request("POST", _PATH, body, headers, tail=1000, on_piece=stream.on_piece)
        except _Cut:
            tally.storm_cuts += 1
            if stream.token is None:
                tally.note(tally.storm_errors, f"no {STREAM_HEADER} header: cannot resume")
                return
            first = False
            continue
        except (OSError, TimeoutError, ResponseError, ValueError) as exc:
            counter = tally.storm_refused if first and isinstance(exc, OSError) else tally.storm_errors
            tally.note(counter, f"storm {'connect' if first else 'resume'} {type(exc).__name__}", str(exc))
            return
        finally:
            conn.close()
        if result.status not in (200, 204):
            counter = tally.storm_refused if result.status in REFUSED_STATUSES else tally.storm_errors
            tally.note(counter, f"storm {'start' if first else 'resume'} HTTP {result.status}",
                       result.body.decode(errors="replace"))
            return
        if not stream.done:
            break  # the stream ended (204: nothing after our id) without [DONE]: judged below
    text = "".join(stream.text)
    if stream.in_band_error is not None:
        tally.note(tally.storm_errors, "storm in-band error event", stream.in_band_error)
    elif not stream.done:
        tally.note(tally.storm_errors, "storm stream ended without [DONE]")
    elif text != expected:
        tally.storm_mismatches += 1
        tally.examples.setdefault("storm text differs", text[:300])
    else:
        tally.storm_completed += 1


async def _storm_client(client: int, cfg: LoadConfig, port: int, expected: dict[str, str],
                        tally: HostileTally, stop: asyncio.Event) -> None:
    rng = random.Random(client)
    prompts = list(expected)
    await asyncio.sleep(cfg.ramp * client / max(1, cfg.resume_storm))
    i = 0
    while not stop.is_set():
        prompt = prompts[(client * 7 + i) % len(prompts)]
        i += 1
        tally.storm_started += 1
        errors = sum(tally.storm_errors.values()) + sum(tally.storm_refused.values())
        try:
            await _storm_stream(client, cfg, port, prompt, expected[prompt], tally, rng, stop)
        except asyncio.CancelledError:
            tally.storm_cancelled += 1
            raise
        if sum(tally.storm_errors.values()) + sum(tally.storm_refused.values()) > errors:
            await asyncio.sleep(0.5)  # refused or failed: do not spin


# -- the hostile process -------------------------------------------------------------------------------------------


async def hostile_main(cfg: LoadConfig, port: int, udp_port: int, expected: dict[str, str], pipe: Any) -> None:
    """Run the mix until the parent says stop (or the run's length plus a minute has passed), reporting a
    progress line on ``pipe`` every sample interval and the final figures at the end."""
    loop = asyncio.get_running_loop()
    tally = HostileTally(storm_resumes=[0] * cfg.resume_storm)
    stop = asyncio.Event()

    def parent_said_stop() -> None:
        """Any message from the parent means stop; the reader is level-triggered, so it goes at once."""
        loop.remove_reader(pipe.fileno())
        stop.set()

    loop.add_reader(pipe.fileno(), parent_said_stop)
    held: dict[int, socket.socket] = {}
    request = _request_bytes(port, chat_body(next(iter(expected)), cfg.max_tokens, True))
    tasks = [asyncio.create_task(_never_reader(i, cfg, port, request, tally, held, stop))
             for i in range(cfg.never_readers)]
    tasks += [asyncio.create_task(_storm_client(i, cfg, port, expected, tally, stop))
              for i in range(cfg.resume_storm)]
    if cfg.fake_initials_per_s > 0:
        tasks.append(asyncio.create_task(_fake_initials(cfg, udp_port, tally, stop)))

    async def report() -> None:
        while True:
            await asyncio.sleep(cfg.sample_interval)
            pipe.send({"t": time.monotonic(), "line": tally.line(len(held))})

    reporter = asyncio.create_task(report())
    try:
        await asyncio.wait_for(stop.wait(), cfg.ramp + cfg.duration + 60)
    except TimeoutError:
        pass
    stop.set()
    loop.remove_reader(pipe.fileno())
    for task in (*tasks, reporter):
        task.cancel()
    _done, stuck = await asyncio.wait([*tasks, reporter], timeout=STOP_SECONDS)
    for task in stuck:  # a cancellation wait_for swallowed: the stop flag ends the loop at its next turn
        task.cancel()
    end = await _never_readers_at_end(held)
    config = {name: getattr(cfg, name) for name in ("never_readers", "fake_initials_per_s", "resume_storm")}
    figures = {f.name: getattr(tally, f.name) for f in fields(tally)}  # not asdict: it mangles Counters
    pipe.send({"final": True, "config": config, "never_at_end": end, "tasks_not_stopped": len(stuck), **figures})
