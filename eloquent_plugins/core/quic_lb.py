"""Connection ids that carry a server id, in the QUIC-LB layout (draft-ietf-quic-load-balancers, the plaintext
("keyless") configuration), so that a balancer routing QUIC by connection id (AWS NLB's QUIC mode, a QUIC-LB
load balancer) keeps a connection on its replica after the client's address or port changes.

Layout::

    First Octet {Config Rotation (3), CID Len or Random Bits (5)} | Server ID (1..15 octets) | Nonce (>= 4 octets)

Config rotation 0b111 is reserved (unroutable ids); server id plus nonce are at most 19 octets. The five low bits
self-describe the length of what follows the first octet (the draft's length self-description). aioquic draws
connection ids at random; ``h3glue.listener.RoutableQuicConnection`` issues these instead (``--server-id``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from eloquent_plugins.core.errors import ConfigError

MAX_PLAINTEXT = 19
"""Server id plus nonce, in octets (a connection id is at most 20)."""
MIN_NONCE = 4
UNROUTABLE_ROTATION = 0b111
DEFAULT_CID_LENGTH = 8
"""aioquic's connection id length: kept when the server id leaves room for a four-octet nonce."""


@dataclass(frozen=True, slots=True)
class QuicLbConfig:
    server_id: bytes
    config_rotation: int = 0
    nonce_length: int = 0
    """0: as many octets as make the id ``DEFAULT_CID_LENGTH`` long, at least ``MIN_NONCE``."""

    def __post_init__(self) -> None:
        if not 1 <= len(self.server_id) <= MAX_PLAINTEXT - MIN_NONCE:
            raise ConfigError(f"a QUIC-LB server id is 1 to {MAX_PLAINTEXT - MIN_NONCE} octets, got "
                              f"{len(self.server_id)}")
        if not 0 <= self.config_rotation < UNROUTABLE_ROTATION:
            raise ConfigError(f"config rotation is 0 to 6 (7 marks unroutable ids), got {self.config_rotation}")
        if self.nonce_length == 0:
            object.__setattr__(self, "nonce_length", max(MIN_NONCE, DEFAULT_CID_LENGTH - 1 - len(self.server_id)))
        if not MIN_NONCE <= self.nonce_length <= MAX_PLAINTEXT - len(self.server_id):
            raise ConfigError(f"the nonce is {MIN_NONCE} to {MAX_PLAINTEXT - len(self.server_id)} octets with a "
                              f"{len(self.server_id)}-octet server id, got {self.nonce_length}")

    @property
    def cid_length(self) -> int:
        return 1 + len(self.server_id) + self.nonce_length

    def new_cid(self, random: Callable[[int], bytes] = os.urandom) -> bytes:
        first = (self.config_rotation << 5) | (self.cid_length - 1)
        return bytes([first]) + self.server_id + random(self.nonce_length)


def decode(cid: bytes, server_id_length: int) -> tuple[int, bytes]:
    """(config rotation, server id) of a routable connection id, as a load balancer reads it; ``ValueError``
    for an unroutable or too short one, or one whose length bits disagree with its length."""
    if len(cid) < 1 + server_id_length + MIN_NONCE:
        raise ValueError(f"connection id of {len(cid)} octets is too short for a {server_id_length}-octet server id")
    rotation, length = cid[0] >> 5, cid[0] & 0x1F
    if rotation == UNROUTABLE_ROTATION:
        raise ValueError("unroutable connection id (config rotation 0b111)")
    if length != len(cid) - 1:
        raise ValueError(f"length bits say {length} octets follow the first, {len(cid) - 1} do")
    return rotation, cid[1:1 + server_id_length]


def parse_server_id(text: str) -> bytes:
    """``--server-id``: hexadecimal octets (``0a1b``), 1 to 15 of them."""
    raw = text.strip().lower().removeprefix("0x")
    try:
        value = bytes.fromhex(raw)
    except ValueError:
        raise ConfigError(f"--server-id is hexadecimal octets such as 0a1b, got {text!r}") from None
    QuicLbConfig(value)  # validates the length
    return value
