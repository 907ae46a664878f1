"""Prefix/suffix delta against a reference payload.

Consecutive engine events share most of their bytes (an OpenAI chunk repeats id, model, created and the JSON
skeleton around a few characters of text). Sending only the differing middle keeps packets that carry a run of
unacknowledged events small, for any engine format, and the original bytes come back exactly.
"""

from __future__ import annotations


def common_prefix_len(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix, by binary search over C-level slice compares."""
    hi = min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def common_suffix_len(a: bytes, b: bytes, limit: int) -> int:
    """Length of the longest common suffix, at most ``limit`` (so prefix and suffix never overlap)."""
    hi = min(len(a), len(b), limit)
    if hi == 0:
        return 0
    if a[len(a) - hi :] == b[len(b) - hi :]:
        return hi
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid :] == b[len(b) - mid :]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def make_delta(reference: bytes, payload: bytes) -> tuple[int, int, bytes]:
    """Return (prefix length, suffix length, middle) such that ``apply_delta`` rebuilds ``payload``."""
    prefix = common_prefix_len(reference, payload)
    limit = min(len(reference), len(payload)) - prefix
    suffix = common_suffix_len(reference, payload, limit)
    return prefix, suffix, payload[prefix : len(payload) - suffix]


def apply_delta(reference: bytes, prefix: int, suffix: int, middle: bytes) -> bytes:
    """Inverse of ``make_delta``; the caller has checked prefix + suffix <= len(reference)."""
    if suffix:
        return reference[:prefix] + middle + reference[len(reference) - suffix :]
    return reference[:prefix] + middle
