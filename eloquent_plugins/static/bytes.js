/*
 * Bytes and text, no Python mirror (Python has bytes, str and base64 built in): UTF-8 both ways (lenient as
 * Python's errors="replace", and strict for JSON), hex, strict base64, joining chunks, taking any binary input as
 * a Uint8Array, and isObject, the one JSON-shape check the decoders share. A leaf but for the errors it raises.
 */

import { DecodeError, InvalidArgument } from "./errors.js";

const utf8 = new TextEncoder();
const utf8Lenient = new TextDecoder("utf-8", { ignoreBOM: true }); // U+FFFD for bad bytes, keeps a BOM (as Python)
const utf8Strict = new TextDecoder("utf-8", { fatal: true });

export function encodeUtf8(text) {
  return utf8.encode(text);
}
export function decodeUtf8(bytes) {
  return utf8Lenient.decode(bytes);
}
export function concatBytes(parts) {
  let size = 0;
  for (const p of parts) size += p.length;
  const out = new Uint8Array(size);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
export function toHex(bytes) {
  let s = "";
  for (const b of bytes) s += b.toString(16).padStart(2, "0");
  return s;
}
export function fromHex(hex) {
  const out = new Uint8Array(hex.length >> 1);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.substr(i * 2, 2), 16);
  return out;
}

/** Strict UTF-8 (a TypeError on bad bytes), for JSON: control records, codec payloads, status lines. */
export function decodeUtf8Strict(bytes) {
  return utf8Strict.decode(bytes);
}

/** Any binary input (Uint8Array, ArrayBuffer, a view, a string as UTF-8) as a Uint8Array. */
export function asBytes(data) {
  if (data instanceof Uint8Array) return data;
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  if (typeof data === "string") return utf8.encode(data);
  throw new InvalidArgument("expected bytes (Uint8Array, ArrayBuffer or string)");
}
const B64 = /^[A-Za-z0-9+/]*={0,2}$/;
/** Strict base64 (Python's b64decode(validate=True)): alphabet and padding checked. */
export function base64Decode(text) {
  if (!B64.test(text) || text.length % 4 !== 0) throw new DecodeError("not base64");
  const bin = atob(text);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}
export function base64Encode(bytes) {
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

/** A JSON object (not null, not an array). */
export function isObject(v) {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}
