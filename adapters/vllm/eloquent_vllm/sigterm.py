"""SIGTERM drains vLLM with the plugin as it drains ``eloquent serve`` (issue 25): Kubernetes, systemd and a rolling
restart stop a replica with SIGTERM, and a replica that stops must not cut the answers it is streaming.

vLLM's launcher (``serve_http``) turns SIGTERM and SIGINT into its shutdown: its engine client stops (aborting what
runs, unless ``--shutdown-timeout``), then the HTTP server. At lifespan startup, after vLLM installed those
handlers on the running loop, :func:`drain_on_sigterm` puts its own on SIGTERM only: it begins the stream
middleware's drain (``/ready`` 503, new streams 503 + ``Retry-After``, HTTP/3 GOAWAY, streams in flight run on for
``--eloquent-drain-timeout`` and are handed over at the deadline). When the drain is done it raises SIGINT in this
process, whose handler is still vLLM's, so vLLM's own shutdown follows unchanged. A second SIGTERM during the drain
does that at once. No private state of vLLM or asyncio is touched: the chain is two signals.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from eloquent_vllm.compat import logger as log

if TYPE_CHECKING:
    from eloquent_plugins.transports.drain import Drain


def drain_on_sigterm(drain: Drain,
                     before_exit: Callable[[], Awaitable[None]] | None = None) -> asyncio.Task[None] | None:
    """Make SIGTERM begin ``drain`` on the running loop, and hand the process to vLLM's shutdown (SIGINT) when the
    drain is done, after ``before_exit`` (what must close while the app still serves: the HTTP/3 front end). The
    drain may also begin by ``POST /eloquent/drain``: the process exits when it is done, as ``eloquent serve`` does.

    Returns the task that waits for the drain (the caller holds it), or None where the loop cannot take signals
    (not the main thread, a platform without ``add_signal_handler``): SIGTERM then stays vLLM's, and the drain
    starts only by ``POST /eloquent/drain``."""
    loop = asyncio.get_running_loop()

    def exit_now() -> None:
        os.kill(os.getpid(), signal.SIGINT)

    def on_sigterm() -> None:
        if not drain.begin("SIGTERM"):
            log.warning("eloquent-plugins: second SIGTERM: stopping without waiting for the drain")
            exit_now()

    async def exit_when_drained() -> None:
        await drain.wait()
        if before_exit is not None:
            try:
                await before_exit()
            except Exception:  # noqa: BLE001 - vLLM's shutdown goes on; lifespan shutdown closes it again
                log.exception("eloquent-plugins: closing before the exit failed")
        log.info("eloquent-plugins: drain done, handing over to vLLM's shutdown")
        exit_now()

    try:
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    except (NotImplementedError, RuntimeError, ValueError) as exc:
        log.warning("eloquent-plugins: SIGTERM stays vLLM's (%s); start a drain with POST /eloquent/drain", exc)
        return None
    return loop.create_task(exit_when_drained(), name="eloquent-exit-when-drained")
