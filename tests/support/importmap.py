"""An import map for the npm packages of tests/js/sdk/node_modules, so a browser loads the real SDKs as ES modules
with no bundler: every exported entry point of every installed package (its ``exports``, resolved with the
conditions a browser's ES module loader would pick: browser, import, module, default), each nested install as a
scope. Served by the browser SDK tests under ``PREFIX``.

The SDKs themselves (openai, ai, @ai-sdk/*) ship ES modules. A dependency that ships only CommonJS (today
@vercel/oidc, which the AI SDK's gateway imports) cannot be imported by a browser as it is: it is served as a
generated ES module that runs its files (its own relative ``require``s, inlined) and exports what node's
``require`` of it gives (names listed by node). No bundler: every other file is served unchanged."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

SDK_DIR = Path(__file__).resolve().parents[1] / "js" / "sdk"
NODE_MODULES = SDK_DIR / "node_modules"
PREFIX = "/sdk/node_modules/"
CJS_PREFIX = "/sdk/cjs/"
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


def is_commonjs(package_dir: Path, file: str) -> bool:
    meta = json.loads((package_dir / "package.json").read_text())
    return file.endswith((".js", ".cjs")) and not file.endswith(".mjs") and meta.get("type") != "module"


def _imports_of(node_modules: Path, root: Path) -> dict[str, str]:
    imports: dict[str, str] = {}
    for package in _packages(node_modules):
        name = package.relative_to(node_modules).as_posix()
        base = PREFIX + package.relative_to(root).as_posix()
        for subpath, file in package_entries(package).items():
            if is_commonjs(package, file):
                imports[name + subpath] = f"{CJS_PREFIX}{package.relative_to(root).as_posix()}/{file.removeprefix('./')}"
            else:
                imports[name + subpath] = f"{base}/{file.removeprefix('./')}"
    return imports


_REQUIRE = re.compile(r"""require\((["'])(\.{1,2}/[^"']+)\1\)""")


def commonjs_module(path: str, node_modules: Path = NODE_MODULES) -> str:
    """The ES module for a CommonJS file under ``CJS_PREFIX`` (``path``: its path below node_modules): its files
    and those it requires relatively, each run once with ``module``/``exports``/``require``; the exports named."""
    entry = (node_modules / path).resolve()
    if not entry.is_relative_to(node_modules.resolve()) or not entry.is_file():
        raise FileNotFoundError(path)
    files: dict[Path, str] = {}
    pending = [entry]
    while pending:
        file = pending.pop()
        if file in files:
            continue
        files[file] = source = file.read_text()
        for _, name in _REQUIRE.findall(source):
            target = (file.parent / name).resolve()
            pending.append(target if target.suffix in (".js", ".cjs") else target.with_name(target.name + ".js"))
    node = shutil.which("node")
    if node is None:
        raise FileNotFoundError("node is needed to list a CommonJS module's exports")
    names = json.loads(subprocess.run([node, "-e", f"console.log(JSON.stringify(Object.keys(require({json.dumps(str(entry))}))))"],
                                      capture_output=True, text=True, check=True, timeout=60).stdout)
    root = node_modules.resolve()
    factories = ",\n".join(f"{json.dumps(f.relative_to(root).as_posix())}: (module, exports, require) => {{\n{src}\n}}"
                            for f, src in files.items())
    exported = "\n".join(f"export const {n} = main[{json.dumps(n)}];" for n in names if n.isidentifier())
    return f"""// generated from CommonJS {path} (tests/support/importmap.py)
const factories = {{
{factories}
}};
const cache = {{}};
function load(file) {{
  if (cache[file]) return cache[file].exports;
  const module = cache[file] = {{ exports: {{}} }};
  const dir = file.slice(0, file.lastIndexOf("/"));
  const require = (name) => {{
    if (!name.startsWith(".")) throw new Error(`require(${{name}}) is not available in the browser`);
    const parts = `${{dir}}/${{name}}`.split("/");
    const out = [];
    for (const part of parts) {{ if (part === "..") out.pop(); else if (part !== ".") out.push(part); }}
    let target = out.join("/");
    if (!factories[target]) target += ".js";
    return load(target);
  }};
  factories[file](module, module.exports, require);
  return module.exports;
}}
const main = load({json.dumps(entry.relative_to(root).as_posix())});
export default main;
{exported}
"""


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
