"""QUIC variable-length integers (RFC 9000 section 16): 1, 2, 4 or 8 bytes, values below 2**62."""

from __future__ import annotations

from eloquent_plugins.core.errors import DecodeError, InvalidArgument

MAX_VARINT = (1 << 62) - 1


def encode_varint(value: int) -> bytes:
    """Encode ``value``; raise ``InvalidArgument`` (a ``ValueError``) for values a varint cannot hold."""
    if value < 0x40:
        if value < 0:
            raise InvalidArgument(f"varint must be non-negative, got {value}")
        return bytes((value,))
    if value < 0x4000:
        return (value | 0x4000).to_bytes(2, "big")
    if value < 0x40000000:
        return (value | 0x80000000).to_bytes(4, "big")
    if value <= MAX_VARINT:
        return (value | 0xC000000000000000).to_bytes(8, "big")
    raise InvalidArgument(f"varint too large: {value}")


def varint_size(value: int) -> int:
    """Bytes ``encode_varint(value)`` would take."""
    if value < 0x40:
        return 1
    if value < 0x4000:
        return 2
    if value < 0x40000000:
        return 4
    return 8


def decode_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Return (value, new position); DecodeError when ``buf`` ends inside the integer."""
    if pos >= len(buf):
        raise DecodeError("truncated varint")
    first = buf[pos]
    length = 1 << (first >> 6)
    end = pos + length
    if end > len(buf):
        raise DecodeError("truncated varint")
    if length == 1:
        return first, end
    if length == 2:
        return ((first & 0x3F) << 8) | buf[pos + 1], end
    value = first & 0x3F
    for i in range(pos + 1, end):
        value = (value << 8) | buf[i]
    return value, end
