"""A client install must not pull in a server: ``import eloquent_client`` (in a fresh interpreter, so nothing
else loaded it first) leaves the server's QUIC listener out of ``sys.modules``, and no module it loads (the
client's own or the glue it uses) holds a listener class (a ``QuicServer`` subclass, or one of its names)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LISTENER_MODULES = ("eloquent_plugins.h3glue.listener", "eloquent_plugins.transports")
"""The listener's module, and the serving part that would bring it (``transports.http3.server``)."""
LISTENER_CLASSES = ("GuardedQuicServer", "QuicServer", "RoutableQuicConnection", "AdmissionStats")

PROBE = """
import json, sys
import eloquent_client
import eloquent_client.sync, eloquent_client.httpx_transport  # every entry a caller may import
ours = {name: m for name, m in list(sys.modules.items()) if name.split(".")[0] in ("eloquent_client", "eloquent_plugins")}
listeners = sorted({f"{value.__module__}.{value.__name__}" for m in ours.values() for value in vars(m).values()
                    if isinstance(value, type) and (value.__name__ in %r
                                                    or any(k.__name__ == "QuicServer" for k in value.__mro__))})
print(json.dumps({"loaded": sorted(ours), "listeners": listeners}))
""" % (LISTENER_CLASSES,)


def test_importing_the_client_loads_no_listener() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert any("h3glue" in m for m in found["loaded"]), "the probe must see the client load the glue it needs"
    bad = [m for m in found["loaded"] if any(m == x or m.startswith(x + ".") for x in LISTENER_MODULES)]
    assert not bad, f"import eloquent_client loaded the server's listener: {bad}"
    assert not found["listeners"], f"listener classes reachable from the client's modules: {found['listeners']}"
