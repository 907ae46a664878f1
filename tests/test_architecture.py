"""The house rules of docs/ARCHITECTURE.md, checked on the source: which part may import which (no arrow runs
back up, no import circle), the things that are defined once, what each package says it is, and the size of a
module (the tests' own rule, no test module importing another, is ``test_layout.py``'s).

Every ``import`` and ``from ... import`` counts, wherever it stands: at the top, inside a function, under
``if TYPE_CHECKING:`` or in a ``try:``. Relative imports are resolved first. A failure names the file, the line
and the rule, so a new arrow is either removed or argued for in docs/ARCHITECTURE.md together with this test. How
the tree is read (files, names, imports, circles) is ``tests/support/source_tree.py``; the rules are here."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.source_tree import (ADAPTERS, CLIENT, PACKAGE, Arrow, all_arrows, circles, describe, imports,
                                       module_name, package_files, parsed, rel, resolve, source_files, under)

CORE = f"{PACKAGE}.core"
HOOKS = f"{CORE}.hooks"
H3GLUE = f"{PACKAGE}.h3glue"
LISTENER = f"{H3GLUE}.listener"
"""The server's hardened QUIC listener: h3glue, but never the client's."""
TRANSPORTS = f"{PACKAGE}.transports"
ENGINE = f"{PACKAGE}.engine"
SIM = f"{PACKAGE}.sim"
IO_LIBRARIES = ("asyncio", "anyio", "aioquic", "starlette", "uvicorn", "httpx", "redis", "socket", "ssl", "selectors",
                "threading", "subprocess")
"""Never in core: it is sans-I/O (the transports, the simulator and the tests drive the same state machines, and
no event loop, socket or thread hides in them)."""
CORE_THIRD_PARTY = {"pluggy": HOOKS}
"""The one third-party library core may use, and where."""
ASSIGNMENTS = (ast.Assign, ast.AnnAssign, *([ast.TypeAlias] if hasattr(ast, "TypeAlias") else []))
"""Module-level statements that bind a name (``type X = ...`` from Python 3.12)."""
MAX_LINES = 400
LONG_MARKER = "# long:"
"""A module over MAX_LINES lines says why in a comment starting with this, in its first three lines."""


def forbidden(arrow: Arrow) -> str | None:
    """Why the house forbids ``arrow``, or None."""
    src, dst = arrow.source, arrow.target
    top = dst.split(".")[0]
    if under(src, CORE):
        if under(dst, PACKAGE) and not under(dst, CORE):
            return "core imports nothing of the package outside core (not even h3glue)"
        if top in IO_LIBRARIES:
            return f"core is sans-I/O: no {top}"
        if top in CORE_THIRD_PARTY and not under(src, CORE_THIRD_PARTY[top]):
            return f"core may use {top} only in {CORE_THIRD_PARTY[top]}"
        if top not in sys.stdlib_module_names and top not in CORE_THIRD_PARTY and top != PACKAGE:
            return f"core is stdlib only: no {top}"
    if under(src, H3GLUE) and under(dst, PACKAGE) and not (under(dst, CORE) or under(dst, H3GLUE)):
        return "h3glue is a leaf beside core: it imports only core (and itself)"
    if under(src, f"{H3GLUE}.common") and under(dst, LISTENER):
        return "h3glue.common is what both ends need: it never loads the server's listener"
    if under(src, CLIENT):
        if under(dst, LISTENER):
            return "the client never loads the server's listener (h3glue.listener)"
        if under(dst, PACKAGE) and not (under(dst, CORE) or under(dst, H3GLUE)):
            return "the client imports only eloquent_plugins.core and eloquent_plugins.h3glue"
        if top in ADAPTERS:
            return "the client never imports an adapter"
    if under(src, SIM) and under(dst, PACKAGE) and not (under(dst, CORE) or under(dst, SIM)):
        return "the simulator imports only core of the package (it drives the real sender and receiver)"
    if under(src, TRANSPORTS) and (under(dst, ENGINE) or under(dst, SIM)):
        return "the transports serve any ASGI app: never the built-in engine or the simulator"
    if under(src, ENGINE) and under(dst, PACKAGE) and not (under(dst, CORE) or under(dst, ENGINE)):
        return "the built-in engine is a plain ASGI app over core: no transport, no simulator"
    if under(src, f"{PACKAGE}.cli.bench") and under(dst, f"{PACKAGE}.cli.commands"):
        return "bench never imports cli.commands (commands -> harness <- bench)"
    if under(src, PACKAGE) and not under(src, f"{PACKAGE}.cli") and under(dst, f"{PACKAGE}.cli"):
        return "only the cli imports the cli: it sits on top of everything else"
    if under(src, PACKAGE) and top in ADAPTERS:
        return "the package never imports an adapter (they plug in through entry points)"
    for adapter in ADAPTERS:
        if under(src, adapter) and top in ADAPTERS and top != adapter:
            return "an adapter never imports another adapter"
        if under(src, adapter) and under(dst, PACKAGE) and not any(under(dst, p)
                                                                   for p in (CORE, H3GLUE, TRANSPORTS)):
            return "an adapter is thin: core and the transports only (no engine, simulator or cli)"
    return None


# --------------------------------------------------------------------------------------------- the walker works


@pytest.mark.parametrize("module,source,target", [
    ("eloquent_plugins.core.sender", "import asyncio", "asyncio"),
    ("eloquent_plugins.core.sender", "def f():\n    from eloquent_plugins.h3glue import X",
     "eloquent_plugins.h3glue.X"),
    ("eloquent_plugins.core.wire", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..transports "
     "import asgi", "eloquent_plugins.transports.asgi"),
    ("eloquent_plugins.core.codecs", "from ...transports.sse import merge", "eloquent_plugins.transports.sse.merge"),
    ("eloquent_plugins.core.limits", "try:\n    import redis.asyncio\nexcept ImportError:\n    pass", "redis.asyncio"),
    ("eloquent_plugins.core.limits", "import pluggy", "pluggy"),
    ("eloquent_plugins.core.limits", "import numpy", "numpy"),
    ("eloquent_client.http3", "from eloquent_plugins.transports.http3 import server",
     "eloquent_plugins.transports.http3.server"),
    ("eloquent_client.sse", "import eloquent_tgi", "eloquent_tgi"),
    ("eloquent_plugins.sim.link", "from eloquent_plugins.transports import asgi", "eloquent_plugins.transports.asgi"),
    ("eloquent_plugins.cli.bench.e2e", "from ..commands.demo import run", "eloquent_plugins.cli.commands.demo.run"),
    ("eloquent_tgi.gateway", "from eloquent_vllm import plugin", "eloquent_vllm.plugin"),
    ("eloquent_plugins.h3glue", "from eloquent_plugins.transports.http3 import x",
     "eloquent_plugins.transports.http3.x"),
    ("eloquent_plugins.transports.sse.middleware", "from eloquent_plugins.engine import create_engine_app",
     "eloquent_plugins.engine.create_engine_app"),
    ("eloquent_plugins.engine.app", "import eloquent_plugins.transports.sse", "eloquent_plugins.transports.sse"),
    ("eloquent_plugins.sim.udp_relay", "from eloquent_plugins import h3glue", "eloquent_plugins.h3glue"),
    ("eloquent_client.http3", "from eloquent_plugins.h3glue.listener import GuardedQuicServer",
     "eloquent_plugins.h3glue.listener.GuardedQuicServer"),
    ("eloquent_plugins.h3glue.common", "from .listener import GuardedQuicServer",
     "eloquent_plugins.h3glue.listener.GuardedQuicServer"),
    ("eloquent_plugins.transports.metrics", "from eloquent_plugins.cli.numbers import positive",
     "eloquent_plugins.cli.numbers.positive"),
    ("eloquent_vllm.serve", "from eloquent_plugins.engine import EngineConfig", "eloquent_plugins.engine.EngineConfig"),
    ("eloquent_plugins.transports.sse.middleware", "import eloquent_vllm", "eloquent_vllm"),
])
def test_the_walker_finds_a_forbidden_import(module: str, source: str, target: str) -> None:
    is_package = module == "eloquent_plugins.core.codecs"  # an __init__.py: "..." climbs from the package itself
    found = list(imports(source, module, is_package=is_package))
    assert [a.target for a in found][-1] == target
    assert forbidden(found[-1]) is not None, f"{module} -> {target} should be forbidden"


@pytest.mark.parametrize("module,target", [
    ("eloquent_plugins.core.sender", "eloquent_plugins.core.wire.encode_packet"),
    ("eloquent_plugins.core.hooks.manager", "pluggy"),
    ("eloquent_plugins.core.stall", "dataclasses.dataclass"),
    ("eloquent_client.http3", "eloquent_plugins.h3glue.common.DatagramH3Connection"),
    ("eloquent_plugins.h3glue.listener", "eloquent_plugins.h3glue.common.abandon"),
    ("eloquent_client.client", "eloquent_plugins.core.assembler.Assembler"),
    ("eloquent_plugins.cli.commands.bench", "eloquent_plugins.cli.bench.e2e"),
    ("eloquent_plugins.cli.commands.demo", "eloquent_plugins.cli.harness.harness"),
    ("eloquent_plugins.cli.bench.e2e", "eloquent_plugins.cli.harness.harness"),
    ("eloquent_plugins.transports.http3.server", "eloquent_plugins.h3glue.listener.GuardedQuicServer"),
    ("eloquent_tgi.gateway", "eloquent_plugins.transports.sse.middleware"),
    ("eloquent_vllm.http3", "eloquent_plugins.transports.http3.server.start_http3_server"),
    ("eloquent_plugins.cli.harness", "eloquent_plugins.engine.create_engine_app"),
    ("eloquent_plugins.sim.eloquent", "eloquent_plugins.core.sender.EloquentSender"),
    ("eloquent_plugins.engine.app", "starlette.applications.Starlette"),
    ("eloquent_plugins.engine", "eloquent_plugins.engine.app.create_engine_app"),
    ("eloquent_plugins.sim.run", "eloquent_plugins.sim.netem.PathConfig"),
    ("eloquent_plugins.transports.sse.middleware", "eloquent_plugins.transports.resume.create_store"),
])
def test_the_walker_allows_the_arrows_the_house_draws(module: str, target: str) -> None:
    assert forbidden(Arrow(module, target, "<string>", 1)) is None


def test_the_walker_sees_every_source_file() -> None:
    names = {module_name(p) for p in source_files()}
    for expected in (CORE, HOOKS, H3GLUE, f"{PACKAGE}.transports.sse.middleware", f"{PACKAGE}.cli.bench.e2e", CLIENT,
                     *ADAPTERS):
        assert expected in names


# --------------------------------------------------------------------------------------------------- the arrows


def test_no_forbidden_import() -> None:
    bad = [f"{arrow}  ({why})" for arrow in all_arrows() if (why := forbidden(arrow)) is not None]
    assert not bad, "forbidden imports:\n" + "\n".join(bad)


# ---------------------------------------------------------------------------------------- no arrow runs back up


PARTS: dict[str, frozenset[str]] = {
    "core": frozenset({"core"}),
    "h3glue": frozenset({"core", "h3glue"}),
    "transports": frozenset({"core", "h3glue", "transports"}),
    "engine": frozenset({"core", "engine"}),
    "sim": frozenset({"core", "sim"}),
    "client": frozenset({"core", "h3glue", "client"}),
    "adapter": frozenset({"core", "h3glue", "transports"}),
    "face": frozenset({"core", "transports"}),
    "cli": frozenset({"core", "h3glue", "transports", "engine", "sim", "client", "cli", "face"}),
}
"""Each part -> the parts it may import (docs/ARCHITECTURE.md): core <- transports <- adapters; the client needs
only core (and h3glue); the simulator drives core; the cli composes everything. An adapter may also import itself
(never another adapter). ``face`` is ``eloquent_plugins/__init__.py``, which re-exports core and loads
``StreamConfig`` from the transports on first use."""


def part_of(module: str) -> str | None:
    """The part a module of the project belongs to, or None for a module outside the project."""
    if module == PACKAGE:
        return "face"
    for name, prefix in (("core", CORE), ("h3glue", H3GLUE), ("transports", TRANSPORTS), ("engine", ENGINE),
                         ("sim", SIM), ("cli", f"{PACKAGE}.cli"), ("client", CLIENT)):
        if under(module, prefix):
            return name
    if module.split(".")[0] in ADAPTERS:
        return "adapter"
    return "unknown" if under(module, PACKAGE) else None


def back_arrow(arrow: Arrow, modules: frozenset[str] = frozenset()) -> str | None:
    """Why ``arrow`` runs against the parts' order (a lower part importing a higher one), or None. A target is
    first resolved to the module it loads, where ``modules`` knows it (``eloquent_plugins.__version__`` is the
    face's)."""
    src, dst = part_of(arrow.source), part_of(resolve(arrow.target, set(modules)) or arrow.target)
    if src is None or dst is None or src == "unknown" or dst == "unknown":
        return None if "unknown" not in (src, dst) else "a module in no part: add it to PARTS and the docs"
    if src == dst == "adapter":
        same = arrow.source.split(".")[0] == arrow.target.split(".")[0]
        return None if same else "an adapter never imports another adapter"
    return None if dst in PARTS[src] else f"{src} may import only {', '.join(sorted(PARTS[src]))}; not {dst}"


@pytest.mark.parametrize("module,target", [
    ("eloquent_plugins.core.sender", "eloquent_plugins.transports.asgi.Scope"),
    ("eloquent_plugins.transports.proxy", "eloquent_plugins.cli.app_factory"),
    ("eloquent_plugins.transports.proxy", "eloquent_tgi.gateway"),
    ("eloquent_client.sse", "eloquent_plugins.transports.sse.middleware"),
    ("eloquent_plugins.sim.run", "eloquent_plugins.h3glue.H3Datagrams"),
    ("eloquent_plugins.engine.app", "eloquent_plugins.transports.metrics"),
    ("eloquent_tgi.gateway", "eloquent_triton.payload"),
    ("eloquent_vllm.middleware", "eloquent_plugins.engine.app"),
    ("eloquent_plugins.h3glue", "eloquent_plugins.transports.http3.server"),
    ("eloquent_plugins.transports.sse.middleware", "eloquent_plugins.newpart.x"),
])
def test_a_back_arrow_is_found(module: str, target: str) -> None:
    assert back_arrow(Arrow(module, target, "<string>", 1)) is not None


@pytest.mark.parametrize("module,target", [
    ("eloquent_tgi.gateway", "eloquent_plugins.transports.proxy.UpstreamRelay"),
    ("eloquent_tgi.gateway", "eloquent_tgi.plugin"),
    ("eloquent_plugins.cli.app_factory", "eloquent_plugins.engine.create_engine_app"),
    ("eloquent_client.http3", "eloquent_plugins.h3glue.H3Datagrams"),
    ("eloquent_plugins", "eloquent_plugins.transports.config.StreamConfig"),
    ("eloquent_plugins.core.sender", "dataclasses"),
])
def test_an_arrow_down_is_not_a_back_arrow(module: str, target: str) -> None:
    assert back_arrow(Arrow(module, target, "<string>", 1)) is None


def test_every_module_is_in_a_part() -> None:
    lost = [rel(p) for p in source_files() if part_of(module_name(p)) in (None, "unknown")]
    assert not lost, f"modules in no part of PARTS: {lost}"


def test_no_back_arrow() -> None:
    modules = frozenset(module_name(p) for p in source_files())
    bad = [f"{arrow}  ({why})" for arrow in all_arrows() if (why := back_arrow(arrow, modules)) is not None]
    assert not bad, "arrows that run back up:\n" + "\n".join(bad)


# --------------------------------------------------------------------------------------------------- no circle


def test_the_circle_finder_finds_a_planted_circle(tmp_path: Path) -> None:
    """Two modules importing each other, one of them only for type checking, and a third importing one of them:
    one circle of the two, found from the files as the real check reads them."""
    package = tmp_path / "planted"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from planted.a import A\n")
    (package / "c.py").write_text("from planted import a\n")
    arrows = []
    for path in sorted(package.glob("*.py")):
        module = "planted" if path.stem == "__init__" else f"planted.{path.stem}"
        arrows += imports(path.read_text(), module, is_package=path.stem == "__init__", path=path.name)
    found = circles(arrows, {"planted", "planted.a", "planted.b", "planted.c"})
    assert [sorted(a.path for a in circle) for circle in found] == [["a.py", "b.py"]]
    assert "a.py, b.py" in describe(found[0])
    assert circles([a for a in arrows if a.path != "b.py"], {"planted", "planted.a", "planted.b", "planted.c"}) == []


def test_no_import_circle() -> None:
    modules = {module_name(p) for p in source_files()}
    found = circles(all_arrows(), modules)
    assert not found, f"{len(found)} import circles:\n" + "\n".join(describe(c) for c in found)


# ------------------------------------------------------------------------------------------------ defined once


def literals(tree: ast.AST) -> set[str]:
    """The string and bytes literals of a module, lower-cased; docstrings and other bare strings do not count."""
    bare = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return {(node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value).lower()
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes) and id(node) not in bare}


def module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a module body, with those under a module-level ``if`` / ``try`` (``TYPE_CHECKING``)."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try):
            for block in (node.body, node.orelse, getattr(node, "finalbody", []),
                          *(h.body for h in getattr(node, "handlers", []))):
                yield from module_level(block)


def bound_names(node: ast.stmt) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return node.targets
    return [node.target if isinstance(node, ast.AnnAssign) else node.name]  # type: ignore[attr-defined]


def defined(tree: ast.Module, kind: type[ast.AST], name: str) -> list[int]:
    """Lines where ``name`` is defined: as a function or class anywhere (``kind``), or bound by a module-level
    assignment (``kind`` is ``ast.Assign``: ``=``, an annotated ``=`` or a ``type`` statement)."""
    if kind is ast.Assign:
        nodes = [n for n in module_level(tree.body) if isinstance(n, ASSIGNMENTS)
                 and any(isinstance(t, ast.Name) and t.id == name for t in bound_names(n))]
    else:
        nodes = [n for n in ast.walk(tree) if isinstance(n, kind) and getattr(n, "name", None) == name]
    return [n.lineno for n in nodes]


def literal_modules(text: str) -> list[str]:
    return [rel(path) for path in package_files() if text in literals(parsed(path))]


def definitions(kind: type[ast.AST], name: str) -> list[str]:
    return [f"{rel(path)}:{line}" for path in package_files() for line in defined(parsed(path), kind, name)]


def test_the_defined_once_checks_see_what_they_look_for() -> None:
    tree = ast.parse('''"""The x-eloquent-stream header."""
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    Scope = dict
HEADER = b"X-Eloquent-Stream"
def percentile(): pass
class C:
    def percentile(self): pass
''')
    assert "x-eloquent-stream" in literals(tree)
    assert "the x-eloquent-stream header." not in literals(tree)
    assert defined(tree, ast.Assign, "Scope") == [4]
    assert defined(tree, ast.FunctionDef, "percentile") == [6, 8]


@pytest.mark.parametrize("literal", ["x-eloquent-stream", "eloquent-transport", "eloquent-scheme",
                                     "eloquent-request-id", "last_event_id"])
def test_each_header_name_is_spelled_in_one_module(literal: str) -> None:
    where = literal_modules(literal)
    assert len(where) == 1, f"{literal!r} is spelled in {where}: import it from eloquent_plugins.core.protocol"


@pytest.mark.parametrize("kind,name", [
    (ast.FunctionDef, "percentile"),
    (ast.FunctionDef, "parse_event_id"),
    (ast.FunctionDef, "format_event_id"),
    (ast.FunctionDef, "format_event"),
    (ast.FunctionDef, "error_body"),
    (ast.ClassDef, "CodecRouter"),
    (ast.ClassDef, "SSEParser"),
    (ast.Assign, "Scope"),
    (ast.Assign, "Message"),
    (ast.Assign, "Receive"),
    (ast.Assign, "Send"),
    (ast.Assign, "ASGIApp"),
    (ast.Assign, "QUIC_MAX_DATAGRAM_SIZE"),
])
def test_defined_once(kind: type[ast.AST], name: str) -> None:
    where = definitions(kind, name)
    assert len(where) == 1, f"{name} is defined in {where or 'no module'}: once, and imported everywhere else"


# ------------------------------------------------------------------------------------------- package faces


MIN_FACE_WORDS = 8
"""A package's ``__init__`` docstring says what the part is: a sentence, not a placeholder like ``"."``."""


def test_every_package_says_what_it_is() -> None:
    bare = []
    for path in source_files():
        if path.name == "__init__.py":
            doc = ast.get_docstring(parsed(path)) or ""
            if len(doc.split()) < MIN_FACE_WORDS:
                bare.append(f"{rel(path)}: {doc!r}")
    assert not bare, "package docstrings that do not say what the part is:\n" + "\n".join(bare)


# ------------------------------------------------------------------------------------------------------ size


def test_a_long_module_says_why() -> None:
    long = []
    for path in source_files():
        lines = path.read_text().splitlines()
        if len(lines) > MAX_LINES and not any(line.startswith(LONG_MARKER) for line in lines[:3]):
            long.append(f"{rel(path)} ({len(lines)} lines)")
    assert not long, (f"over {MAX_LINES} lines without a '{LONG_MARKER} <reason>' comment in the first three lines "
                      f"(split it, or say why not): " + ", ".join(long))
