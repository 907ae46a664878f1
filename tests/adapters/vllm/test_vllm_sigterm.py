"""The vLLM plugin's SIGTERM chain (``eloquent_vllm.sigterm``) on a real event loop and real signals, without vLLM:
the loop carries handlers as vLLM's launcher installs them (one on SIGINT, one on SIGTERM). The whole chain in a
real vLLM server: ``tests/e2e/test_migration_vllm.py::test_vllm_with_the_plugin_sigterm_drains_and_hands_over``."""

from __future__ import annotations

import asyncio
import os
import signal

from eloquent_plugins.transports.drain import Drain, DrainState
from eloquent_vllm.sigterm import drain_on_sigterm

GUARD_S = 30.0
"""Waits are bounded by this; never a speed assertion."""


async def _until(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.005)

    try:
        await asyncio.wait_for(poll(), GUARD_S)
    except asyncio.TimeoutError:
        raise AssertionError(f"{what}: not within {GUARD_S} s") from None


async def _vllm_like_loop() -> tuple[asyncio.Event, list[str]]:
    """What vLLM's launcher leaves on the loop: SIGINT and SIGTERM both start its shutdown."""
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    calls: list[str] = []

    def vllm_shutdown(name: str) -> None:
        calls.append(name)
        stopped.set()

    loop.add_signal_handler(signal.SIGINT, vllm_shutdown, "SIGINT")
    loop.add_signal_handler(signal.SIGTERM, vllm_shutdown, "SIGTERM")
    return stopped, calls


def test_sigterm_drains_first_and_vllms_shutdown_follows_when_the_drain_is_done() -> None:
    async def main() -> None:
        stopped, calls = await _vllm_like_loop()
        drain = Drain(timeout=GUARD_S)
        drain.enter()  # a request in flight
        closed: list[DrainState] = []

        async def before_exit() -> None:
            closed.append(drain.state)

        task = drain_on_sigterm(drain, before_exit)
        assert task is not None
        os.kill(os.getpid(), signal.SIGTERM)
        await _until(lambda: drain.draining, "the drain began")
        assert drain.reason == "SIGTERM" and not drain.ready
        await asyncio.sleep(0.2)
        assert not stopped.is_set(), "vLLM's shutdown ran while a request was still in flight"
        drain.leave()  # the request finishes: the drain is done
        await asyncio.wait_for(stopped.wait(), GUARD_S)
        assert calls == ["SIGINT"], "vLLM's shutdown must come once, by SIGINT, never by its SIGTERM handler"
        assert closed == [DrainState.DONE], "HTTP/3 (before_exit) closes after the drain, before vLLM's shutdown"

    asyncio.run(main())


def test_a_second_sigterm_stops_at_once() -> None:
    async def main() -> None:
        stopped, calls = await _vllm_like_loop()
        drain = Drain(timeout=GUARD_S)
        drain.enter()  # never leaves: only the second SIGTERM can end this
        assert drain_on_sigterm(drain) is not None
        os.kill(os.getpid(), signal.SIGTERM)
        await _until(lambda: drain.draining, "the drain began")
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(stopped.wait(), GUARD_S)
        assert calls == ["SIGINT"] and drain.state is DrainState.DRAINING

    asyncio.run(main())


def test_the_drain_route_also_ends_in_vllms_shutdown() -> None:
    """``POST /eloquent/drain`` (no signal) begins the same drain: the process exits when it is done, as
    ``eloquent serve`` does."""
    async def main() -> None:
        stopped, calls = await _vllm_like_loop()
        drain = Drain(timeout=GUARD_S)
        assert drain_on_sigterm(drain) is not None
        drain.begin("POST /eloquent/drain")
        await asyncio.wait_for(stopped.wait(), GUARD_S)
        assert calls == ["SIGINT"] and drain.state is DrainState.DONE

    asyncio.run(main())
