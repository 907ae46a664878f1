/*
 * Mirrors core/varint.py: QUIC variable-length integers (RFC 9000 s16), the wire format's only number encoding.
 * Separate because the packets, the receiver's acks and the tests use it on its own.
 */

import { DecodeError, InvalidArgument, LimitExceeded } from "./errors.js";

const MAX_SAFE = Number.MAX_SAFE_INTEGER;

export const MAX_VARINT = (1n << 62n) - 1n;

/** Encode a QUIC varint (RFC 9000 s16); numbers or BigInts up to 2^62 - 1. */
export function encodeVarint(value) {
  if (typeof value === "bigint") {
    if (value < 0n || value > MAX_VARINT) throw new InvalidArgument(`varint out of range: ${value}`);
    if (value < 0x40000000n) return encodeVarint(Number(value));
    const out = new Uint8Array(8);
    let v = value;
    for (let i = 7; i >= 0; i--) {
      out[i] = Number(v & 0xffn);
      v >>= 8n;
    }
    out[0] |= 0xc0;
    return out;
  }
  if (!Number.isInteger(value) || value < 0) throw new InvalidArgument(`varint must be a non-negative integer: ${value}`);
  if (value < 0x40) return Uint8Array.of(value);
  if (value < 0x4000) return Uint8Array.of(0x40 | (value >> 8), value & 0xff);
  if (value < 0x40000000) {
    return Uint8Array.of(0x80 | (value >>> 24), (value >>> 16) & 0xff, (value >>> 8) & 0xff, value & 0xff);
  }
  if (value > MAX_SAFE) throw new InvalidArgument("varint above 2^53 - 1: pass a BigInt");
  return encodeVarint(BigInt(value));
}

export function varintSize(value) {
  if (value < 0x40) return 1;
  if (value < 0x4000) return 2;
  if (value < 0x40000000) return 4;
  return 8;
}

/** Returns [value, new position]; DecodeError when the buffer ends inside the integer. */
export function decodeVarint(buf, pos) {
  if (pos >= buf.length) throw new DecodeError("truncated varint");
  const first = buf[pos];
  const length = 1 << (first >> 6);
  const end = pos + length;
  if (end > buf.length) throw new DecodeError("truncated varint");
  if (length === 1) return [first, end];
  let value = first & 0x3f;
  for (let i = pos + 1; i < end; i++) value = value * 256 + buf[i];
  if (value > MAX_SAFE) throw new LimitExceeded("varint above 2^53 - 1 (not representable here)");
  return [value, end];
}

/** As decodeVarint, as a BigInt: the whole 62-bit range. */
export function decodeVarintBig(buf, pos) {
  if (pos >= buf.length) throw new DecodeError("truncated varint");
  const first = buf[pos];
  const length = 1 << (first >> 6);
  const end = pos + length;
  if (end > buf.length) throw new DecodeError("truncated varint");
  let value = BigInt(first & (length === 1 ? 0xff : 0x3f));
  for (let i = pos + 1; i < end; i++) value = (value << 8n) | BigInt(buf[i]);
  return [value, end];
}
