"""Debian's nginx as a fleet's load balancer, as docs/DEPLOY.md sets it up: HTTP on TCP to an ``upstream`` of
replicas, and UDP (HTTP/3, Eloquent datagrams) through the ``stream {}`` module at layer 4. Started from a
generated config in a temp dir, on free ports; what ``bench load --restart-every`` and the tests run."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eloquent_plugins.cli.bench.procs import free_port, wait_for_port

NGINX_CONF = """{modules}
worker_processes 1;
daemon off;
{user}
error_log {tmp}/error.log warn;
pid {tmp}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
{upstreams}
    server {{
        listen 127.0.0.1:{port};
{locations}
    }}
}}
{stream}"""
NGINX_LOCATION = """
        location {path} {{
            proxy_pass {target};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            {extra}
        }}"""


STREAM_MODULE = Path("/usr/lib/nginx/modules/ngx_stream_module.so")
"""Debian's ``libnginx-mod-stream`` installs the ``stream {}`` module as a dynamic module (loaded by path)."""
NGINX_UPSTREAM = """
    upstream {name} {{
        {balance}
{servers}
    }}"""
NGINX_STREAM = """
stream {{
{upstreams}
    server {{
        listen 127.0.0.1:{udp_port} udp;
        proxy_pass {name};
        {extra}
    }}
}}
"""


def nginx_upstream(name: str, ports: list[int], balance: str = "", server_options: str = "") -> str:
    """An ``upstream`` block (``http`` or ``stream``) over 127.0.0.1 ``ports``."""
    servers = "\n".join(f"        server 127.0.0.1:{p} {server_options};" for p in ports)
    return NGINX_UPSTREAM.format(name=name, balance=balance, servers=servers)


@dataclass(frozen=True)
class Balancer:
    url: str
    udp_port: int
    error_log: Path


@contextlib.contextmanager
def run_nginx(port: int, **conf: str) -> Iterator[Path]:
    """Start nginx with ``NGINX_CONF`` filled from ``conf``, wait for ``port``; yields its temp dir."""
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(exe):
        raise RuntimeError("nginx is not installed (apt-get install -y nginx)")
    with tempfile.TemporaryDirectory(prefix="eloquent-nginx-") as tmp:
        user = "user root;" if os.geteuid() == 0 else ""  # the directive only means something to root
        path = Path(tmp, "nginx.conf")
        path.write_text(NGINX_CONF.format(user=user, tmp=tmp, port=port, **{
            "modules": "", "upstreams": "", "stream": "", **conf}))
        output = Path(tmp, "nginx.out")
        with output.open("wb") as out:
            proc = subprocess.Popen([exe, "-c", str(path), "-p", tmp, "-e", f"{tmp}/error.log"],
                                    stdout=out, stderr=subprocess.STDOUT)
        try:
            try:
                wait_for_port(port, proc=proc)
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}\nnginx said:\n{output.read_text(errors='replace')}") from None
            yield Path(tmp)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextlib.contextmanager
def nginx_balancer(http: str, udp: str, *, target: str = "http://eloquent_http", location: str = "",
                   udp_extra: str = "", alt_svc: bool = False) -> Iterator[Balancer]:
    """nginx in front of replicas: TCP port -> ``target`` (``upstream eloquent_http``, given in ``http``: see
    ``nginx_upstream``) with ``location`` directives; UDP port -> the ``stream {}`` module's ``upstream
    eloquent_quic`` (``udp``), with ``udp_extra`` in its ``server``; ``alt_svc``: TCP responses advertise the UDP
    port (``Alt-Svc``) instead of the replicas'. Needs ``libnginx-mod-stream`` on Debian."""
    port, udp_port = free_port(), free_port()
    modules = f"load_module {STREAM_MODULE};" if STREAM_MODULE.exists() else ""  # else built in (or absent)
    if alt_svc:  # advertise nginx's UDP port instead of the replicas' (docs/DEPLOY.md)
        location += f" proxy_hide_header Alt-Svc; add_header Alt-Svc 'h3=\":{udp_port}\"; ma=86400' always;"
    locations = NGINX_LOCATION.format(path="/", target=target, extra=location)
    stream = NGINX_STREAM.format(upstreams=udp, udp_port=udp_port, name="eloquent_quic", extra=udp_extra)
    with run_nginx(port, modules=modules, upstreams=http, locations=locations, stream=stream) as tmp:
        yield Balancer(f"http://127.0.0.1:{port}", udp_port, tmp / "error.log")
