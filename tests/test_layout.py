"""The package layout holds: what each part may load."""

from __future__ import annotations

import json
import subprocess
import sys

SERVER_MODULES = ("eloquent_plugins.transports", "starlette", "uvicorn", "pluggy")
"""What importing the client must not load: it needs only the core (and aioquic), never a server."""


def test_client_import_loads_no_server_modules() -> None:
    code = "import eloquent_client, json, sys; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    loaded = json.loads(out)
    assert "eloquent_client" in loaded and "eloquent_plugins.core.assembler" in loaded
    server = [m for m in loaded if any(m == name or m.startswith(name + ".") for name in SERVER_MODULES)]
    assert not server, f"import eloquent_client loads server modules: {server}"
