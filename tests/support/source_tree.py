"""The project's source tree as ``tests/test_architecture.py`` reads it: which files are the package's, the
dotted name of each, every import in each (resolved to absolute names, wherever it stands), and the import circles
among them. No rule lives here: the rules (what may import what) are the test's."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "eloquent_plugins"
CLIENT = "eloquent_client"
ADAPTERS = ("eloquent_vllm", "eloquent_tgi", "eloquent_triton", "eloquent_openai")
SOURCE_ROOTS = {PACKAGE: ROOT, CLIENT: ROOT / "client", **{a: ROOT / "adapters" / a.split("_")[1] for a in ADAPTERS}}
"""Import package -> the folder that holds it (one distribution, several top-level packages)."""


@dataclass(frozen=True, slots=True)
class Arrow:
    source: str
    """The importing module (dotted)."""
    target: str
    """The imported name, dotted as far as the statement names it (``from a.b import c`` gives ``a.b.c``)."""
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source} -> {self.target}"


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def module_name(path: Path) -> str:
    """The dotted module name of a source file, from the folder its top-level package sits in."""
    for package, root in SOURCE_ROOTS.items():
        if path.is_relative_to(root / package):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join(parts)
    raise ValueError(f"{path} is in no known package")


def imports(source: str | ast.Module, module: str, *, is_package: bool = False,
            path: str = "<string>") -> Iterator[Arrow]:
    """Every import in ``source`` (the text or tree of ``module``), anywhere in it, resolved to absolute names."""
    tree = ast.parse(source) if isinstance(source, str) else source
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Arrow(module, alias.name, path, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                yield Arrow(module, base if alias.name == "*" else f"{base}.{alias.name}", path, node.lineno)


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def source_files() -> list[Path]:
    return sorted(p for package, root in SOURCE_ROOTS.items() for p in (root / package).rglob("*.py"))


def package_files() -> list[Path]:
    """The package and the client: where the defined-once rules hold."""
    return [p for p in source_files() if module_name(p).split(".")[0] in (PACKAGE, CLIENT)]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def all_arrows() -> list[Arrow]:
    return [arrow for path in source_files()
            for arrow in imports(parsed(path), module_name(path), is_package=path.name == "__init__.py",
                                 path=rel(path))]


def resolve(target: str, modules: set[str] | frozenset[str]) -> str | None:
    """The module an import loads: the longest known module that ``target`` starts with, so ``from pkg import
    name`` is an arrow to ``pkg.name`` where that is a submodule, and to ``pkg`` (its ``__init__``) where not."""
    parts = target.split(".")
    for end in range(len(parts), 0, -1):
        if (name := ".".join(parts[:end])) in modules:
            return name
    return None


def circles(arrows: list[Arrow], modules: set[str]) -> list[list[Arrow]]:
    """Every import circle among ``modules``: each strongly connected set of two or more, as the arrows inside it
    (Tarjan's algorithm, iterative so that a deep chain does not hit the recursion limit)."""
    edges: dict[str, dict[str, Arrow]] = {m: {} for m in modules}
    for arrow in arrows:
        dst = resolve(arrow.target, modules)
        if arrow.source in edges and dst is not None and dst != arrow.source:
            edges[arrow.source].setdefault(dst, arrow)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[Arrow]] = []
    for root in sorted(modules):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.add(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append([edges[m][d] for m in sorted(members) for d in sorted(edges[m]) if d in members])
    return found


def describe(circle: list[Arrow]) -> str:
    files = sorted({arrow.path for arrow in circle})
    return f"circle of {len(files)} files: {', '.join(files)}\n" + "\n".join(f"    {arrow}" for arrow in circle)
