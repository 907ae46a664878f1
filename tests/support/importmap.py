"""An import map for the npm packages of tests/js/sdk/node_modules, so a browser loads the real SDKs as ES modules
with no bundler: every exported entry point of every installed package (its ``exports``, resolved with the
conditions a browser's ES module loader would pick: browser, import, module, default), each nested install as a
scope. Served by the browser SDK tests under ``PREFIX``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SDK_DIR = Path(__file__).resolve().parents[1] / "js" / "sdk"
NODE_MODULES = SDK_DIR / "node_modules"
PREFIX = "/sdk/node_modules/"
CONDITIONS = ("browser", "import", "module", "default")


def _resolve(target: Any) -> str | None:
    """The file an ``exports`` target names under the browser's conditions (None: nothing for a browser)."""
    if isinstance(target, str):
        return target
    if isinstance(target, list):
        for item in target:
            found = _resolve(item)
            if found is not None:
                return found
        return None
    if isinstance(target, dict):
        for condition in CONDITIONS:
            if condition in target:
                found = _resolve(target[condition])
                if found is not None:
                    return found
    return None


def package_entries(package_dir: Path) -> dict[str, str]:
    """``{"": "./index.mjs", "/v4": "./v4/index.js", ...}``: subpath (after the package name) -> file."""
    meta = json.loads((package_dir / "package.json").read_text())
    exports = meta.get("exports")
    entries: dict[str, str] = {}
    if isinstance(exports, dict) and any(key.startswith(".") for key in exports):
        for key, target in exports.items():
            if "*" in key or key.endswith("/") or key == "./package.json":
                continue
            found = _resolve(target)
            if found is not None and not found.endswith(".d.ts") and not found.endswith(".cjs"):
                entries[key[1:]] = found
    elif exports is not None:
        found = _resolve(exports)
        if found is not None:
            entries[""] = found
    if "" not in entries:
        main = meta.get("module") or meta.get("main") or "index.js"
        entries[""] = main if main.startswith(".") else f"./{main}"
    return entries


def _packages(node_modules: Path) -> list[Path]:
    out = []
    for child in sorted(node_modules.iterdir()):
        if child.name.startswith("@") and child.is_dir():
            out.extend(p for p in sorted(child.iterdir()) if (p / "package.json").exists())
        elif (child / "package.json").exists():
            out.append(child)
    return out


def _imports_of(node_modules: Path, root: Path) -> dict[str, str]:
    imports: dict[str, str] = {}
    for package in _packages(node_modules):
        name = package.relative_to(node_modules).as_posix()
        base = PREFIX + package.relative_to(root).as_posix()
        for subpath, file in package_entries(package).items():
            imports[name + subpath] = f"{base}/{file.removeprefix('./')}"
    return imports


def import_map(node_modules: Path = NODE_MODULES) -> dict[str, Any]:
    """``{"imports": {...}, "scopes": {...}}`` with URLs under ``PREFIX``."""
    if not node_modules.is_dir():
        raise FileNotFoundError(f"{node_modules} is missing: run `npm ci` in {node_modules.parent} (./dev test does)")
    scopes: dict[str, dict[str, str]] = {}
    for nested in sorted(node_modules.rglob("node_modules")):
        if nested == node_modules or not nested.is_dir():
            continue
        owner = nested.parent.relative_to(node_modules).as_posix()
        scopes[f"{PREFIX}{owner}/"] = _imports_of(nested, node_modules)
    return {"imports": _imports_of(node_modules, node_modules), "scopes": scopes}
