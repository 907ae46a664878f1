"""Issue 17: one flag vocabulary. CLI > environment > default for every setting (``eloquent serve`` and the vLLM
plugin), the generated table matches the parsers, ``--port 0`` is one number for TCP and UDP, an ignored
``--eloquent-port`` is an error, TLS on TCP from the files HTTP/3 serves, CORS for pages on other origins, and
``--progress/--no-progress`` on every bench (off by default when stderr is not a terminal)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from eloquent_plugins.cli import flags
from eloquent_plugins.cli.commands.common import stream_config
from eloquent_plugins.cli.main import build_parser
from eloquent_plugins.transports.config import env_name, plugin_flag
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.transports.cors import CorsMiddleware

ELOQUENT = str(Path(sys.executable).with_name("eloquent"))
_SPEC = importlib.util.spec_from_file_location("flagtable", Path(__file__).parents[1] / "docs" / "flagtable.py")
assert _SPEC is not None and _SPEC.loader is not None
flagtable = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(flagtable)
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "stream": True}


def command_parser(*path: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def serve_args(argv: list[str], environ: dict[str, str]) -> argparse.Namespace:
    return flags.parse(command_parser("serve"), argv, environ)


# -- precedence ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("flag", "dest", "env_value", "cli_value", "default", "expected_env", "expected_cli"), [
    ("--keepalive", "keepalive", "1", "2.5", 15.0, 1.0, 2.5),
    ("--stream-transport", "stream_transport", "sse", "none", "eloquent", "sse", "none"),
    ("--port", "port", "9001", "9002", 8000, 9001, 9002),
    ("--tpot", "tpot", "0.5", "0.25", 0.03, 0.5, 0.25),
    ("--log-level", "log_level", "debug", "error", "info", "debug", "error"),
    ("--body-timeout", "body_timeout", "7", "0", 30.0, 7.0, 0.0),
    ("--cors-origin", "cors_origin", "*", "https://a.example", None, "*", "https://a.example"),
])
def test_serve_cli_beats_env_beats_default(flag: str, dest: str, env_value: str, cli_value: str, default: object,
                                           expected_env: object, expected_cli: object) -> None:
    env = {f"ELOQUENT_{flag[2:].replace('-', '_').upper()}": env_value}
    assert getattr(serve_args([], {}), dest) == default
    assert getattr(serve_args([], env), dest) == expected_env
    assert getattr(serve_args([flag, cli_value], env), dest) == expected_cli


def test_keepalive_from_the_environment_reaches_the_stream_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case: ``ELOQUENT_KEEPALIVE=1 eloquent serve`` sent no keep-alive (argparse's 15 won)."""
    monkeypatch.setenv("ELOQUENT_KEEPALIVE", "1")
    monkeypatch.setenv("ELOQUENT_STREAM_TRANSPORT", "sse")
    config = stream_config(flags.parse(command_parser("serve"), ["--ttft", "3.5"]))
    assert (config.keepalive, config.stream_transport) == (1.0, "sse")
    assert stream_config(flags.parse(command_parser("serve"), ["--keepalive", "3"])).keepalive == 3.0


def test_switches_read_the_environment_too() -> None:
    assert serve_args([], {"ELOQUENT_NO_RESUME": "yes"}).no_resume is True
    assert serve_args([], {"ELOQUENT_NO_RESUME": "0"}).no_resume is False
    assert stream_config(serve_args(["--no-resume"], {})).resume is False


@pytest.mark.parametrize(("variable", "value", "words"), [
    ("ELOQUENT_KEEPALIVE", "nan", "expected seconds"), ("ELOQUENT_STREAM_TRANSPORT", "pigeon", "choose one of"),
    ("ELOQUENT_PORT", "99999", "expected a port number"), ("ELOQUENT_NO_RESUME", "maybe", "expected 1/0"),
])
def test_a_bad_environment_value_is_one_line_naming_the_variable(variable: str, value: str, words: str) -> None:
    with pytest.raises(ConfigError, match=f"^{variable}='{value}': .*{words}"):
        serve_args([], {variable: value})


def test_the_console_script_names_the_bad_variable() -> None:
    env = {**os.environ, "ELOQUENT_KEEPALIVE": "soon"}
    done = subprocess.run([ELOQUENT, "serve"], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 2 and "ELOQUENT_KEEPALIVE='soon'" in done.stderr and "Traceback" not in done.stderr


def vllm_parser() -> argparse.ArgumentParser:
    from tests.support.vllm_parser import serve_parser

    return serve_parser()


@pytest.fixture
def vllm_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    from eloquent_vllm.implementations import HTTP3_SERVER_ENV, SSE_MIDDLEWARE_ENV

    for name in [k for k in os.environ if k.startswith("ELOQUENT_")]:
        monkeypatch.delenv(name)
    # Stand-ins the hook imports instead of the real middleware and front end (nothing is started here).
    monkeypatch.setenv(SSE_MIDDLEWARE_ENV, "tests.adapters.vllm.test_vllm_adapter:StampMiddleware")
    monkeypatch.setenv(HTTP3_SERVER_ENV, "tests.adapters.vllm.test_vllm_adapter:start_fake_http3")
    yield monkeypatch


@pytest.mark.parametrize(("flag", "field", "env_value", "cli_value", "default"), [
    ("--eloquent-keepalive", "keepalive", "4", "2.5", 15.0),
    ("--eloquent-body-timeout", "body_timeout", "9", "1", 30.0),
    ("--eloquent-max-streams-per-client", "max_streams_per_client", "3", "5", 0),
    ("--eloquent-resume-store", "resume_store", "redis://r:6379/1", "redis://s:6379/2", "memory://"),
])
def test_vllm_plugin_cli_beats_env_beats_default(vllm_env: pytest.MonkeyPatch, flag: str, field: str,
                                                 env_value: str, cli_value: str, default: object) -> None:
    from eloquent_vllm.options import EloquentVllmSettings

    def value(argv: list[str]) -> object:
        parsed = vllm_parser().parse_args(["m", "--stream-transport", "sse", *argv])
        return getattr(EloquentVllmSettings.from_namespace(parsed).config, field)

    assert value([]) == default
    vllm_env.setenv(env_name(flag), env_value)
    assert str(value([])) == str(type(default)(env_value))
    assert str(value([flag, cli_value])) == str(type(default)(cli_value))


def test_vllm_plugin_flags_are_serves_names_with_the_prefix() -> None:
    from eloquent_vllm.options import SHARED_FLAGS, add_eloquent_args

    plugin = argparse.ArgumentParser()
    add_eloquent_args(plugin)
    serve = command_parser("serve")._option_string_actions
    for name, _, _ in SHARED_FLAGS:
        assert name in serve, f"{name}: the plugin takes a setting eloquent serve does not"
        assert plugin_flag(name) in plugin._option_string_actions
        assert env_name(plugin_flag(name)) == env_name(name)
    assert set(plugin._option_string_actions["--stream-transport"].choices) == set(serve["--stream-transport"].choices)


def test_vllm_plugin_refuses_a_udp_port_it_would_ignore(vllm_env: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        vllm_parser().parse_args(["m", "--stream-transport", "sse", "--eloquent-port", "9999"])
    assert exited.value.code == 2 and "--eloquent-port" in capsys.readouterr().err


# -- the table, the unit rule, the bench options ------------------------------------------------------------------


def test_the_flag_table_matches_the_parsers() -> None:
    assert flagtable.DOC.read_text(encoding="utf-8") == flagtable.render(), \
        "docs/FLAGS.md is stale: python docs/flagtable.py --write"


def test_old_millisecond_spellings_still_work_and_say_so_once(capsys: pytest.CaptureFixture[str]) -> None:
    args = command_parser("demo").parse_args(["--tpot-ms", "50", "--rtt-ms", "20", "--tpot-ms", "40"])
    assert (args.tpot, args.rtt) == (0.04, 0.02)
    err = capsys.readouterr().err
    assert err.count("--tpot-ms is deprecated") == 1 and "use --tpot 0.05" in err
    assert err.count("--rtt-ms is deprecated") == 1 and len(err.splitlines()) == 2
    assert command_parser("demo").parse_args(["--tpot", "0.05"]).tpot == 0.05
    relay = command_parser("relay").parse_args(["--target", "127.0.0.1:9", "--up-delay-ms", "30"])
    assert relay.up_delay == 0.03


def test_every_bench_takes_progress_and_plot() -> None:
    bench = command_parser("bench")
    sub = next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        options = parser._option_string_actions
        assert {"--progress", "--no-progress", "--plot"} <= set(options), name


def test_progress_defaults_to_whether_stderr_is_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = command_parser("bench", "sim")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert flags.parse(parser, [], {}).progress is False
    assert flags.parse(parser, ["--progress"], {}).progress is True
    assert flags.parse(parser, [], {"ELOQUENT_PROGRESS": "1"}).progress is True
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert flags.parse(parser, [], {}).progress is True
    assert flags.parse(parser, ["--no-progress"], {}).progress is False


def test_no_carriage_returns_in_a_log_unless_asked() -> None:
    argv = [ELOQUENT, "bench", "sim", "--scenario", "loss=0.1,tokens=20,streams=1", "--seeds", "1", "--jobs", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELOQUENT_")}
    quiet = subprocess.run(argv, capture_output=True, timeout=300, env=env, check=False)  # bytes: \r survives
    assert quiet.returncode == 0, quiet.stderr
    assert b"\r" not in quiet.stderr
    loud = subprocess.run([*argv, "--progress"], capture_output=True, timeout=300, env=env, check=False)
    assert loud.returncode == 0 and b"\r" in loud.stderr


# -- serve: --port 0, the ignored port, TLS on TCP, CORS ----------------------------------------------------------


def test_an_eloquent_port_that_would_be_ignored_is_an_error() -> None:
    done = subprocess.run([ELOQUENT, "serve", "--stream-transport", "sse", "--eloquent-port", "9999"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "--eloquent-port" in done.stderr and "--stream-transport eloquent" in done.stderr


class _Served:
    """``eloquent serve ARGS`` with ``--port 0``: reads the TCP and UDP ports it logs."""

    def __init__(self, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ELOQUENT_")}
        self.proc = subprocess.Popen([ELOQUENT, "serve", "--port", "0", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        self.tcp = self.udp = 0
        self.scheme = ""
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line)
                if m := re.search(r"on udp://[^:]+:(\d+)", line):
                    self.udp = int(m.group(1))
                if m := re.search(r"running on (https?)://[^:]+:(\d+)", line):
                    self.scheme, self.tcp = m.group(1), int(m.group(2))
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(60) or not self.tcp:
            self.close()
            raise AssertionError("".join(self.lines))

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[_Served, str]]:
    from eloquent_plugins.transports.http3.certs import generate_dev_certificate

    pair = generate_dev_certificate(tmp_path_factory.mktemp("tls"))
    served = _Served("--certfile", str(pair.certfile), "--keyfile", str(pair.keyfile), "--keepalive", "1",
                     "--cors-origin", "https://page.example")
    try:
        yield served, str(pair.certfile)
    finally:
        served.close()


def test_port_zero_is_one_number_for_tcp_and_udp(tls_server: tuple[_Served, str]) -> None:
    served, _ = tls_server
    assert served.tcp and served.tcp == served.udp, "".join(served.lines)


async def test_a_certificate_serves_https_on_tcp_and_http3_from_the_same_files(
        tls_server: tuple[_Served, str]) -> None:
    from eloquent_client import EloquentClient

    served, cert = tls_server
    assert served.scheme == "https"
    async with httpx.AsyncClient(base_url=f"https://127.0.0.1:{served.tcp}", verify=ssl.create_default_context(cafile=cert), timeout=30) as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200 and "x-eloquent-stream" in response.headers
    assert f':{served.udp}"' in response.headers.get("alt-svc", "")
    async with EloquentClient(f"https://127.0.0.1:{served.udp}", transport="eloquent", verify=cert,
                              timeout=30) as h3, h3.stream("POST", "/v1/chat/completions", json=CHAT) as stream:
        assert await stream.text()
        assert stream.delivery == "eloquent"


async def test_cors_preflight_and_request_from_another_origin(tls_server: tuple[_Served, str]) -> None:
    served, cert = tls_server
    origin = {"origin": "https://page.example"}
    async with httpx.AsyncClient(base_url=f"https://127.0.0.1:{served.tcp}", verify=ssl.create_default_context(cafile=cert), timeout=30) as client:
        preflight = await client.options("/v1/chat/completions", headers={
            **origin, "access-control-request-method": "POST",
            "access-control-request-headers": "content-type, last-event-id"})
        real = await client.post("/v1/chat/completions", json=CHAT, headers=origin)
        stranger = await client.post("/v1/chat/completions", json=CHAT, headers={"origin": "https://evil.example"})
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == "https://page.example"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "last-event-id" in preflight.headers["access-control-allow-headers"]
    assert real.status_code == 200 and real.headers["access-control-allow-origin"] == "https://page.example"
    assert "x-eloquent-stream" in real.headers["access-control-expose-headers"]
    assert "x-eloquent-stream" in real.headers
    assert "access-control-allow-origin" not in stranger.headers


async def test_cors_middleware_any_origin() -> None:
    async def app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
        await send({"type": "http.response.start", "status": 200,  # type: ignore[operator]
                    "headers": [(b"x-eloquent-stream", b"s1")]})
        await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]

    transport = httpx.ASGITransport(app=CorsMiddleware(app, "*"))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        plain = await client.get("/")
        crossed = await client.get("/", headers={"origin": "https://x.example"})
        preflight = await client.options("/", headers={"origin": "https://x.example",
                                                       "access-control-request-method": "POST"})
    assert "access-control-allow-origin" not in plain.headers
    assert crossed.headers["access-control-allow-origin"] == "*"
    assert crossed.headers["access-control-expose-headers"].startswith("x-eloquent-stream")
    assert preflight.status_code == 204 and preflight.headers["access-control-allow-origin"] == "*"
