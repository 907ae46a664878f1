"""The HTTP/3 front end's lifecycles (``transports.http3.lifecycle``) against docs/PROTOCOL.md, section 8: every
state of each enum has its row in the doc's table, no row names a state the enum lacks, and the connection's
allowed transitions are exactly the states its "leaves on" column names."""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path

import pytest

from eloquent_plugins.transports.http3.lifecycle import (
    CONNECTION_TRANSITIONS,
    ConnectionState,
    LifecycleError,
    RequestState,
    advance,
)

PROTOCOL = Path(__file__).resolve().parents[3] / "docs" / "PROTOCOL.md"


def section_8() -> str:
    text = PROTOCOL.read_text()
    start = text.index("## 8. HTTP/3 delivery lifecycles")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def table_of(enum: type[Enum]) -> dict[str, str]:
    """The doc's table for ``enum``: state name -> its "leaves on" cell (the table after the line naming it)."""
    text = section_8()
    name = f"`transports.http3.lifecycle.{enum.__name__}`"
    assert name in text, f"docs/PROTOCOL.md section 8 does not name {name}"
    rows: dict[str, str] = {}
    for line in text[text.index(name):].splitlines()[1:]:
        if rows and not line.startswith("|"):
            break  # the table ended
        match = re.match(r"\|\s*`([A-Z_]+)`\s*\|[^|]*\|(.*)\|\s*$", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


@pytest.mark.parametrize("enum", [ConnectionState, RequestState])
def test_each_state_has_its_row_in_the_doc_and_no_other(enum: type[Enum]) -> None:
    assert set(table_of(enum)) == {state.name for state in enum}


def test_the_connections_transitions_are_the_docs_leaves_on_column() -> None:
    rows = table_of(ConnectionState)
    names = {state.name for state in ConnectionState}
    for state in ConnectionState:
        documented = set(re.findall(r"`([A-Z_]+)`", rows[state.name])) & names
        allowed = {s.name for s in CONNECTION_TRANSITIONS[state]}
        assert documented == allowed, f"{state.name}: the doc says {sorted(documented)}, the code {sorted(allowed)}"


def test_the_lifecycle_only_moves_forward_and_terminated_is_final() -> None:
    assert CONNECTION_TRANSITIONS[ConnectionState.TERMINATED] == frozenset()
    order = list(ConnectionState)
    for state, targets in CONNECTION_TRANSITIONS.items():
        assert all(order.index(t) > order.index(state) for t in targets), state
        assert ConnectionState.TERMINATED in targets or state is ConnectionState.TERMINATED
    assert advance(ConnectionState.OPEN, ConnectionState.GOING_AWAY) is ConnectionState.GOING_AWAY
    with pytest.raises(LifecycleError):
        advance(ConnectionState.FAILED, ConnectionState.OPEN)
    with pytest.raises(LifecycleError):
        advance(ConnectionState.TERMINATED, ConnectionState.TERMINATED)
    assert [s for s in ConnectionState if s.live] == [ConnectionState.OPEN, ConnectionState.GOING_AWAY,
                                                      ConnectionState.CLOSING]
