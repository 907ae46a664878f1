"""The pure-ASGI class that vLLM's ``--middleware`` installs in every API server process.

vLLM builds ``--middleware`` classes as ``Class(app)`` with no arguments, so this one reads its settings from the
parsed CLI namespace at ``scope["app"].state.args`` (vLLM sets it in ``build_app``) and builds the real
:class:`eloquent_plugins.transports.sse.middleware.EloquentMiddleware` around the inner app. It also rides the app's ASGI
lifespan: after vLLM's own startup it starts the HTTP/3 front end on the running loop (same process, same app,
so HTTP/3 requests go through this whole middleware stack too), and closes it on shutdown. SIGTERM begins the
drain, and vLLM's own shutdown follows when it is done (``sigterm.py``).

It can also be given by hand, without the plugin: ``--middleware eloquent_vllm.middleware.VllmStreamMiddleware``
(transport then comes from ``ELOQUENT_STREAM_TRANSPORT``, default ``sse``).
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from eloquent_plugins.transports.asgi import ASGIApp, Message, Receive, Scope, Send
from eloquent_vllm.compat import log_like_vllm, logger
from eloquent_vllm.errors import ServeOptionsError
from eloquent_vllm.http3 import Http3Frontend
from eloquent_vllm.implementations import sse_middleware_class
from eloquent_vllm.metrics import register_stream_metrics
from eloquent_vllm.options import EloquentVllmSettings
from eloquent_vllm.sigterm import drain_on_sigterm
from eloquent_vllm.token_ids import with_token_ids


class VllmStreamMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._inner: ASGIApp | None = None
        self._settings: EloquentVllmSettings | None = None
        self._http3: Http3Frontend | None = None
        self._drain: Any = None
        """The stream middleware's drain (``POST /eloquent/drain``, ``/ready``, SIGTERM): the HTTP/3 front end
        follows it."""
        self._exit_task: Any = None
        """Waits for the drain, then hands the process to vLLM's shutdown (``sigterm.drain_on_sigterm``)."""
        self._bodies: Any = None
        """The stream middleware's ledger of incomplete request bodies: the HTTP/3 front end counts in it too."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        if self._inner is None:  # lifespan off (or a test client): build on first use
            self._setup(scope.get("app"))
        assert self._inner is not None
        config = self._settings.config if self._settings is not None else None
        if (scope["type"] == "http" and config is not None and config.migrate and config.resume
                and not config.resume_store.startswith("memory:")):
            # Streams another replica may continue: vLLM is asked for token ids (an exact continuation).
            scope, receive = await with_token_ids(scope, receive, config.max_request_bytes)
        await self._inner(scope, receive, send)

    def _setup(self, outer_app: Any) -> EloquentVllmSettings:
        args = getattr(getattr(outer_app, "state", None), "args", None)
        settings = EloquentVllmSettings.from_namespace(
            args if isinstance(args, Namespace) else Namespace(), default_transport="sse"
        )
        if settings.config is None:  # transport "none" named explicitly: stay out of the way
            self._inner = self.app
        else:
            from eloquent_plugins.transports.stack import wrap  # here: the adapter imports without a transport

            # The stack ``eloquent serve`` hosts (transports.stack), in the same order. vLLM runs its own uvicorn,
            # so the header-read timeout (a uvicorn protocol class) cannot be installed here.
            stack = wrap(self.app, settings.config, stream_layer=sse_middleware_class(),
                         alt_svc=settings.wants_http3, alt_svc_port=settings.http3_port)
            self._drain = getattr(stack.streams, "drain", None)
            self._bodies = getattr(stack.streams, "bodies", None)  # incomplete bodies: one ledger for both transports
            register_stream_metrics(stack.streams)  # vLLM's /metrics shows them too; /eloquent/metrics always does
            self._inner = stack.app
        self._settings = settings
        return settings

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        outer_app = scope.get("app")
        try:
            self._setup(outer_app)  # vLLM set app.state.args in build_app, before the lifespan runs
        except Exception as exc:  # noqa: BLE001 - any failure must become lifespan.startup.failed
            logger.exception("eloquent-plugins: cannot build the stream middleware")
            await receive()  # lifespan.startup
            await send({"type": "lifespan.startup.failed", "message": f"eloquent-plugins: {exc}"})
            return

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                try:
                    await self._startup(outer_app)
                except Exception as exc:  # noqa: BLE001 - reported through ASGI: uvicorn logs it, stops
                    logger.exception("eloquent-plugins: startup failed")
                    await send({"type": "lifespan.startup.failed", "message": f"eloquent-plugins: {exc}"})
                    return
            await send(message)

        async def receive_wrapper() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await self._shutdown()
            return message

        assert self._inner is not None
        await self._inner(scope, receive_wrapper, send_wrapper)  # the SSE middleware sees the lifespan too

    async def _startup(self, outer_app: Any) -> None:
        settings = self._settings
        assert settings is not None
        args = getattr(outer_app.state, "args", None)
        if settings.wants_http3:
            servers = int(getattr(args, "api_server_count", None) or 1)
            if servers > 1:
                raise ServeOptionsError(
                    f"--stream-transport eloquent supports one API server process, this is one of {servers}; "
                    "use --api-server-count 1 or --stream-transport sse"
                )
            assert settings.config is not None and settings.http3_port is not None
            self._http3 = await Http3Frontend.start(
                outer_app, host=settings.http3_host, port=settings.http3_port, config=settings.config,
                drain=self._drain, bodies=self._bodies,
            )
        log_like_vllm()
        if self._drain is not None:
            self._exit_task = drain_on_sigterm(self._drain, before_exit=self._shutdown)
        logger.info(
            "eloquent-plugins: stream transport %s active%s",
            settings.transport,
            f", HTTP/3 on udp/{settings.http3_port}" if self._http3 else "",
        )

    async def _shutdown(self) -> None:
        http3, self._http3 = self._http3, None
        if http3 is not None:
            await http3.close()
