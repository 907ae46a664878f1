"""The layout holds: what importing each part loads, and what a test module may import of the tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.source_tree import ROOT, Arrow, imports, parsed, rel, under

SERVER_MODULES = ("eloquent_plugins.transports", "starlette", "uvicorn", "pluggy")
"""What importing the client must not load: it needs only the core (and aioquic), never a server."""


def test_client_import_loads_no_server_modules() -> None:
    code = "import eloquent_client, json, sys; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    loaded = json.loads(out)
    assert "eloquent_client" in loaded and "eloquent_plugins.core.assembler" in loaded
    server = [m for m in loaded if any(m == name or m.startswith(name + ".") for name in SERVER_MODULES)]
    assert not server, f"import eloquent_client loads server modules: {server}"


# ------------------------------------------------------------------------------------------------------ tests


TESTS = ROOT / "tests"
TEST_SUPPORT = "tests.support"
"""The one place a test module imports from: shared fixtures are in conftest.py (pytest loads them), shared
helpers in tests/support/; a test module never imports another test module (or a conftest)."""


def module_of_test_file(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def breaks_tests_rule(arrow: Arrow) -> str | None:
    """Why a test module's import breaks the tests' rule, or None: inside ``tests`` only ``tests.support``."""
    if not under(arrow.target, "tests") or under(arrow.target, TEST_SUPPORT):
        return None
    return "a test module imports only tests.support of the tests (move the shared helper there)"


@pytest.mark.parametrize("module,source,bad", [
    ("tests.e2e.test_openai_vllm", "from tests.adapters.vllm.test_vllm_transports import SlotHolder", True),
    ("tests.transports.test_drain", "from .test_faults import helper", True),
    ("tests.core.test_wire", "from tests import conftest", True),
    ("tests.core.test_wire", "from ..conftest import fixture", True),
    ("tests.e2e.test_openai_vllm", "from tests.support.vllm import SlotHolder", False),
    ("tests.support.chaos", "from tests.support.cutproxy import CutPlan", False),
    ("tests.core.test_wire", "from eloquent_plugins.core.wire import encode_packet", False),
])
def test_the_tests_rule_sees_a_test_module_import(module: str, source: str, bad: bool) -> None:
    found = list(imports(source, module))
    assert (breaks_tests_rule(found[-1]) is not None) is bad


def test_no_test_module_imports_another() -> None:
    bad = []
    for path in sorted(TESTS.rglob("*.py")):
        if "node_modules" in path.parts:
            continue
        module = module_of_test_file(path)
        for arrow in imports(parsed(path), module, is_package=path.name == "__init__.py", path=rel(path)):
            if (why := breaks_tests_rule(arrow)) is not None:
                bad.append(f"{arrow}  ({why})")
    assert not bad, "test modules importing test modules:\n" + "\n".join(bad)
