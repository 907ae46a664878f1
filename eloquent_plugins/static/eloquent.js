// long: the client in one ES module (it imports only the small fallback.js beside it), so a page loads it with one <script type="module"> (/eloquent/client.js)
/*
 * Eloquent client for browsers and node >= 20: plain ES module, no build step, no dependencies.
 *
 * A JavaScript port of the Python reference (eloquent_plugins.core + eloquent_client), byte for byte on the wire:
 * varints, packets (docs/PROTOCOL.md), prefix/suffix deltas, the receiver (reassembly, fragments, in-order
 * rendering, acks), the control records with the stream digest, the SSE parser, the OpenAI/TGI/Triton codecs, and
 * `EloquentClient`, which streams over WebTransport datagrams where it can and over SSE (with Last-Event-ID resume)
 * where it cannot. tests/js/ checks it against vectors the Python core writes (tests/vectors/).
 *
 * Numbers: every varint this side decodes must fit a JS number (below 2^53); larger ones raise LimitExceeded
 * (Python accepts up to 2^62 - 1, which no server of this package sends). Times are seconds (floats), as in Python.
 */

// ============================================================================================== errors
export class EloquentError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = new.target.name;
  }
}
/** The peer broke the wire protocol; `code` is what a transport reports when it closes. */
export class ProtocolError extends EloquentError {
  constructor(message, options) {
    super(message, options);
    this.code = 0x1;
  }
}
export class DecodeError extends ProtocolError {
  constructor(message, options) {
    super(message, options);
    this.code = 0x2;
  }
}
export class LimitExceeded extends ProtocolError {
  constructor(message, options) {
    super(message, options);
    this.code = 0x3;
  }
}
export class ProtocolViolation extends ProtocolError {
  constructor(message, options) {
    super(message, options);
    this.code = 0x4;
  }
}
export class ConfigError extends EloquentError {}
export class InvalidArgument extends EloquentError {}
export class CodecError extends EloquentError {}
export class BadEventId extends EloquentError {}
/** The request could not be completed; every client error derives from it. */
export class ClientError extends EloquentError {}
/** The server answered with a status other than 200: `status`, and `body` (decoded JSON, else text). */
export class HTTPStatusError extends ClientError {
  constructor(status, body, message) {
    super(message ?? `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}
/** The stream ended before its final event, or its digest did not match the trailer. */
export class IncompleteStream extends ClientError {}
/** The server reported an error inside the stream (an in-band error event). */
export class StreamFailed extends ClientError {
  constructor(message, payload) {
    super(message);
    this.payload = payload;
  }
}

// ============================================================================================== constants
export const VERSION = 1;
export const PacketType = Object.freeze({ DATA: 1, ACK: 2, KEEPALIVE: 3 });
export const EventKind = Object.freeze({ DATA: 0, END: 1, ERROR: 2 });
export const STREAM_HEADER = "x-eloquent-stream";
export const TRANSPORT_HEADER = "eloquent-transport";
export const DATAGRAM = "datagram";
export const REFERENCE_SLACK = 256;
const KIND_MASK = 0x03;
const FLAG_FRAGMENT = 0x04;
const FLAG_DELTA = 0x08;
const KNOWN_FLAGS = KIND_MASK | FLAG_FRAGMENT | FLAG_DELTA;
const MAX_SAFE = Number.MAX_SAFE_INTEGER;

export const DEFAULT_LIMITS = Object.freeze({
  maxDatagramSize: 1200,
  maxEventBytes: 1 << 20,
  maxEntriesPerPacket: 4096,
  maxIndexGap: 4096,
  maxBufferedBytes: 8 << 20,
  maxStreams: 256,
  maxRunDatagrams: 16,
  maxStreamId: MAX_SAFE,
});

/** Limits with some fields overridden (camelCase names of core.limits.Limits). */
export function makeLimits(overrides = {}) {
  const limits = { ...DEFAULT_LIMITS, ...overrides };
  if (limits.maxDatagramSize < 64) throw new ConfigError("maxDatagramSize must be at least 64 bytes");
  return Object.freeze(limits);
}

// ============================================================================================== bytes
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
function bytesEqual(a, b) {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
function asBytes(data) {
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

/** Grows a byte array; varints and bytes appended in order. */
class ByteWriter {
  constructor() {
    this.parts = [];
  }
  byte(b) {
    this.parts.push(Uint8Array.of(b));
  }
  varint(v) {
    this.parts.push(encodeVarint(v));
  }
  bytes(b) {
    this.parts.push(b);
  }
  finish() {
    return concatBytes(this.parts);
  }
}

// ============================================================================================== varint
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

// ============================================================================================== wire
/** Python's round(): half to even, so ack delays encode as Python's do. */
function roundHalfEven(x) {
  const f = Math.floor(x);
  const d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

function checkHeader(data) {
  if (data.length < 3) throw new DecodeError(`packet too short (${data.length} bytes)`);
  if (data[0] !== VERSION) throw new DecodeError(`unsupported protocol version ${data[0]} (this side speaks ${VERSION})`);
  const type = data[1];
  if (type !== PacketType.DATA && type !== PacketType.ACK && type !== PacketType.KEEPALIVE) {
    throw new DecodeError(`unknown packet type ${type}`);
  }
  return type;
}

/** Stream id of a packet without decoding the rest, to route it. */
export function peekStreamId(data) {
  checkHeader(data);
  return decodeVarint(data, 2)[0];
}

/** Past the last field only padding may follow: zero bytes to the end (PROTOCOL.md, "Padding"). */
function expectEnd(data, pos) {
  for (let i = pos; i < data.length; i++) {
    if (data[i] !== 0) throw new DecodeError(`${data.length - pos} trailing bytes after packet (padding is zero bytes only)`);
  }
}

/**
 * Decode one datagram into {type: "data", streamId, packetNumber, refIndex, firstIndex, entries},
 * {type: "ack", streamId, nextExpected, largestPacketNumber, ackDelay} or {type: "keepalive", streamId,
 * packetNumber}. Raises only DecodeError / LimitExceeded, whatever the bytes.
 */
export function decodePacket(data, limits = DEFAULT_LIMITS) {
  data = asBytes(data);
  if (data.length > Math.max(limits.maxDatagramSize, 1) * 64) {
    throw new LimitExceeded(`datagram of ${data.length} bytes is far above the ${limits.maxDatagramSize} budget`);
  }
  const type = checkHeader(data);
  let [streamId, pos] = decodeVarint(data, 2);
  if (streamId > limits.maxStreamId) throw new LimitExceeded(`stream id ${streamId} above maxStreamId`);
  if (type === PacketType.ACK) {
    let nextExpected, largest, delayUs;
    [nextExpected, pos] = decodeVarint(data, pos);
    [largest, pos] = decodeVarint(data, pos);
    [delayUs, pos] = decodeVarint(data, pos);
    expectEnd(data, pos);
    return { type: "ack", streamId, nextExpected, largestPacketNumber: largest, ackDelay: delayUs / 1_000_000 };
  }
  if (type === PacketType.KEEPALIVE) {
    let number;
    [number, pos] = decodeVarint(data, pos);
    expectEnd(data, pos);
    return { type: "keepalive", streamId, packetNumber: number };
  }
  return decodeData(data, pos, streamId, limits);
}

function decodeData(data, pos, streamId, limits) {
  let number, ref, firstIndex, count;
  [number, pos] = decodeVarint(data, pos);
  [ref, pos] = decodeVarint(data, pos);
  [firstIndex, pos] = decodeVarint(data, pos);
  [count, pos] = decodeVarint(data, pos);
  if (count === 0) throw new DecodeError("data packet with no entries");
  if (count > limits.maxEntriesPerPacket) {
    throw new LimitExceeded(`${count} entries in one packet (maxEntriesPerPacket=${limits.maxEntriesPerPacket})`);
  }
  if (firstIndex + count - 1 > MAX_SAFE) throw new LimitExceeded("event index above 2^53 - 1");
  const refIndex = ref === 0 ? null : ref - 1;
  if (refIndex !== null && refIndex >= firstIndex) {
    throw new DecodeError(`reference event ${refIndex} is not before the first entry ${firstIndex}`);
  }
  const entries = [];
  const end = data.length;
  for (let i = 0; i < count; i++) {
    if (pos >= end) throw new DecodeError("truncated entry");
    const flags = data[pos++];
    if (flags & ~KNOWN_FLAGS) throw new DecodeError(`unknown entry flags 0x${flags.toString(16).padStart(2, "0")}`);
    const kind = flags & KIND_MASK;
    if (kind > EventKind.ERROR) throw new DecodeError(`unknown event kind ${kind}`);
    if (kind !== EventKind.DATA && i !== count - 1) throw new DecodeError("a final event must be the last entry of its packet");
    let fragTotal = 0, fragOffset = 0, prefix = 0, suffix = 0, length;
    const isFragment = (flags & FLAG_FRAGMENT) !== 0;
    const isDelta = (flags & FLAG_DELTA) !== 0;
    if (isFragment && isDelta) throw new DecodeError("an entry cannot be both a fragment and a delta");
    if (isFragment) {
      if (count !== 1) throw new DecodeError("a fragment must travel alone in its packet");
      [fragTotal, pos] = decodeVarint(data, pos);
      [fragOffset, pos] = decodeVarint(data, pos);
    } else if (isDelta) {
      [prefix, pos] = decodeVarint(data, pos);
      [suffix, pos] = decodeVarint(data, pos);
      if (i === 0 && refIndex === null) throw new DecodeError("delta entry without a reference event");
    }
    [length, pos] = decodeVarint(data, pos);
    if (pos + length > end) throw new DecodeError("entry runs past the end of the packet");
    if (isFragment) {
      if (fragTotal > limits.maxEventBytes) {
        throw new LimitExceeded(`event of ${fragTotal} bytes (maxEventBytes=${limits.maxEventBytes})`);
      }
      if (length === 0 || fragOffset + length > fragTotal) throw new DecodeError("fragment outside its event");
    } else if (length + prefix + suffix > limits.maxEventBytes) {
      throw new LimitExceeded(`event above maxEventBytes=${limits.maxEventBytes}`);
    }
    entries.push({
      index: firstIndex + i, kind, middle: data.slice(pos, pos + length), delta: isDelta, prefix, suffix,
      fragTotal, fragOffset,
    });
    pos += length;
  }
  expectEnd(data, pos);
  return { type: "data", streamId, packetNumber: number, refIndex, firstIndex, entries };
}

/** Encode a packet object (the shapes decodePacket returns) to bytes, identical to the Python encoder. */
export function encodePacket(packet) {
  const w = new ByteWriter();
  if (packet.type === "ack") {
    const delayUs = Math.max(0, roundHalfEven(packet.ackDelay * 1_000_000));
    w.byte(VERSION); w.byte(PacketType.ACK);
    w.varint(packet.streamId); w.varint(packet.nextExpected); w.varint(packet.largestPacketNumber);
    w.varint(delayUs > MAX_SAFE ? MAX_VARINT : delayUs);
    return w.finish();
  }
  if (packet.type === "keepalive") {
    w.byte(VERSION); w.byte(PacketType.KEEPALIVE);
    w.varint(packet.streamId); w.varint(packet.packetNumber);
    return w.finish();
  }
  if (packet.type !== "data") throw new InvalidArgument(`not a packet: ${packet && packet.type}`);
  w.byte(VERSION); w.byte(PacketType.DATA);
  w.varint(packet.streamId); w.varint(packet.packetNumber);
  w.varint(packet.refIndex === null || packet.refIndex === undefined ? 0 : packet.refIndex + 1);
  w.varint(packet.firstIndex); w.varint(packet.entries.length);
  for (const e of packet.entries) {
    let flags = e.kind;
    if (e.fragTotal) {
      w.byte(flags | FLAG_FRAGMENT); w.varint(e.fragTotal); w.varint(e.fragOffset);
    } else if (e.delta) {
      w.byte(flags | FLAG_DELTA); w.varint(e.prefix); w.varint(e.suffix);
    } else {
      w.byte(flags);
    }
    w.varint(e.middle.length);
    w.bytes(e.middle);
  }
  return w.finish();
}

// ============================================================================================== delta
export function makeDelta(reference, payload) {
  const hi = Math.min(reference.length, payload.length);
  let prefix = 0;
  while (prefix < hi && reference[prefix] === payload[prefix]) prefix++;
  const limit = hi - prefix;
  let suffix = 0;
  while (suffix < limit && reference[reference.length - 1 - suffix] === payload[payload.length - 1 - suffix]) suffix++;
  return [prefix, suffix, payload.slice(prefix, payload.length - suffix)];
}

/** Inverse of makeDelta; the caller checked prefix + suffix <= reference.length. */
export function applyDelta(reference, prefix, suffix, middle) {
  const out = new Uint8Array(prefix + middle.length + suffix);
  out.set(reference.subarray(0, prefix), 0);
  out.set(middle, prefix);
  if (suffix) out.set(reference.subarray(reference.length - suffix), prefix + middle.length);
  return out;
}

// ============================================================================================== sha-256
const K256 = new Uint32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
  0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
  0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
  0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
  0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
  0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
  0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
  0xc67178f2,
]);

/** Incremental, synchronous SHA-256 (crypto.subtle is neither), for the stream digest. */
export class Sha256 {
  constructor() {
    this.h = new Uint32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19]);
    this.block = new Uint8Array(64);
    this.fill = 0;
    this.length = 0; // bytes
    this.w = new Uint32Array(64);
  }
  update(bytes) {
    let i = 0;
    this.length += bytes.length;
    while (i < bytes.length) {
      const take = Math.min(64 - this.fill, bytes.length - i);
      this.block.set(bytes.subarray(i, i + take), this.fill);
      this.fill += take;
      i += take;
      if (this.fill === 64) {
        this.compress(this.block);
        this.fill = 0;
      }
    }
    return this;
  }
  compress(b) {
    const w = this.w, h = this.h;
    for (let t = 0; t < 16; t++) w[t] = (b[t * 4] << 24) | (b[t * 4 + 1] << 16) | (b[t * 4 + 2] << 8) | b[t * 4 + 3];
    for (let t = 16; t < 64; t++) {
      const x = w[t - 15], y = w[t - 2];
      const s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3);
      const s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10);
      w[t] = (w[t - 16] + s0 + w[t - 7] + s1) | 0;
    }
    let [a, bb, c, d, e, f, g, hh] = h;
    for (let t = 0; t < 64; t++) {
      const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
      const ch = (e & f) ^ (~e & g);
      const t1 = (hh + S1 + ch + K256[t] + w[t]) | 0;
      const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
      const maj = (a & bb) ^ (a & c) ^ (bb & c);
      const t2 = (S0 + maj) | 0;
      hh = g; g = f; f = e; e = (d + t1) | 0; d = c; c = bb; bb = a; a = (t1 + t2) | 0;
    }
    h[0] += a; h[1] += bb; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
  }
  /** The digest of what was fed so far (the hash can go on being updated). */
  digest() {
    const saved = { h: this.h.slice(), block: this.block.slice(), fill: this.fill, length: this.length };
    const bits = this.length * 8;
    const pad = new Uint8Array(((this.fill < 56 ? 56 : 120) - this.fill) + 8);
    pad[0] = 0x80;
    const n = pad.length;
    const hi = Math.floor(bits / 0x100000000), lo = bits >>> 0;
    pad[n - 8] = hi >>> 24; pad[n - 7] = (hi >>> 16) & 0xff; pad[n - 6] = (hi >>> 8) & 0xff; pad[n - 5] = hi & 0xff;
    pad[n - 4] = lo >>> 24; pad[n - 3] = (lo >>> 16) & 0xff; pad[n - 2] = (lo >>> 8) & 0xff; pad[n - 1] = lo & 0xff;
    this.update(pad);
    const out = new Uint8Array(32);
    for (let i = 0; i < 8; i++) {
      out[i * 4] = this.h[i] >>> 24; out[i * 4 + 1] = (this.h[i] >>> 16) & 0xff;
      out[i * 4 + 2] = (this.h[i] >>> 8) & 0xff; out[i * 4 + 3] = this.h[i] & 0xff;
    }
    this.h = saved.h; this.block = saved.block; this.fill = saved.fill; this.length = saved.length;
    return out;
  }
  hexdigest() {
    return toHex(this.digest());
  }
}

// ============================================================================================== control records
const KIND_NAMES = ["data", "end", "error"];
const KINDS = { data: EventKind.DATA, end: EventKind.END, error: EventKind.ERROR };

/** SHA-256 over the events in order, each as an 8-byte big-endian length then its payload. */
export class StreamDigest {
  constructor() {
    this.hash = new Sha256();
    this.count = 0;
  }
  update(payload) {
    const n = payload.length;
    const hi = Math.floor(n / 0x100000000), lo = n >>> 0;
    this.hash.update(Uint8Array.of(hi >>> 24, (hi >>> 16) & 0xff, (hi >>> 8) & 0xff, hi & 0xff,
      lo >>> 24, (lo >>> 16) & 0xff, (lo >>> 8) & 0xff, lo & 0xff));
    this.hash.update(payload);
    this.count += 1;
  }
  hexdigest() {
    return this.hash.hexdigest();
  }
  static of(payloads) {
    const d = new StreamDigest();
    for (const p of payloads) d.update(p);
    return d.hexdigest();
  }
}

function eventJson(event) {
  return { index: event.index, kind: KIND_NAMES[event.kind], payload: base64Encode(event.payload) };
}
/** `{"type":"trailer",...}\n`, byte-identical to core.control.encode_trailer. */
export function encodeTrailer(trailer) {
  return utf8.encode(JSON.stringify({ type: "trailer", count: trailer.count, sha256: trailer.sha256,
    final: eventJson(trailer.final) }) + "\n");
}
export function encodeFallback(events) {
  return utf8.encode(JSON.stringify({ type: "fallback", events: events.map(eventJson) }) + "\n");
}

function isObject(v) {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}
function controlEvent(obj) {
  if (!isObject(obj)) throw new DecodeError("control record: event is not an object");
  const { index, kind, payload } = obj;
  if (typeof index !== "number" || !Number.isInteger(index) || index < 0) {
    throw new DecodeError(`control record: bad event index ${JSON.stringify(index)}`);
  }
  if (!Object.hasOwn(KINDS, kind) || typeof payload !== "string") {
    throw new DecodeError(`control record: bad event kind ${JSON.stringify(kind)} or payload`);
  }
  let raw;
  try {
    raw = base64Decode(payload);
  } catch {
    throw new DecodeError("control record: payload is not base64");
  }
  return { index, payload: raw, kind: KINDS[kind] };
}
function isAsciiSpace(b) {
  return b === 0x20 || (b >= 0x09 && b <= 0x0d);
}

/** Incremental parser of the control records (one JSON object per line). */
export class ControlParser {
  constructor({ maxRecordBytes = 64 << 20 } = {}) {
    this.maxRecordBytes = maxRecordBytes;
    this.buffer = new Uint8Array(0);
  }
  feed(data) {
    this.buffer = this.buffer.length ? concatBytes([this.buffer, asBytes(data)]) : asBytes(data).slice();
    const out = [];
    let start = 0;
    for (;;) {
      const end = this.buffer.indexOf(0x0a, start);
      if (end < 0) break;
      const line = this.buffer.subarray(start, end);
      start = end + 1;
      if (!line.every(isAsciiSpace)) out.push(ControlParser.record(line));
    }
    this.buffer = this.buffer.slice(start);
    if (this.buffer.length > this.maxRecordBytes) throw new LimitExceeded(`control record above ${this.maxRecordBytes} bytes`);
    return out;
  }
  /** The stream ended: a partial record left over is an error. */
  close() {
    if (!this.buffer.every(isAsciiSpace)) throw new DecodeError("the response ended inside a control record");
  }
  static record(line) {
    let obj;
    try {
      obj = JSON.parse(utf8Strict.decode(line));
    } catch {
      throw new DecodeError("control record is not JSON");
    }
    if (!isObject(obj)) throw new DecodeError("control record is not an object");
    if (obj.type === "trailer") {
      const { count, sha256 } = obj;
      if (typeof count !== "number" || !Number.isInteger(count) || count < 1 || typeof sha256 !== "string") {
        throw new DecodeError("trailer: bad count or digest");
      }
      const final = controlEvent(obj.final);
      if (final.kind === EventKind.DATA || final.index !== count - 1) {
        throw new DecodeError("trailer: the final event must be END/ERROR at index count - 1");
      }
      return { type: "trailer", count, sha256, final };
    }
    if (obj.type === "fallback") {
      if (!Array.isArray(obj.events)) throw new DecodeError("fallback: events is not a list");
      return { type: "fallback", events: obj.events.map(controlEvent) };
    }
    throw new DecodeError(`unknown control record type ${JSON.stringify(obj.type ?? null)}`);
  }
}

// ============================================================================================== receiver
class Fragments {
  constructor(total, kind) {
    this.total = total;
    this.kind = kind;
    this.data = new Uint8Array(total);
    this.ranges = [];
  }
  /** Store a piece; true when the whole event is present. */
  add(offset, piece) {
    this.data.set(piece, offset);
    const all = [...this.ranges, [offset, offset + piece.length]].sort((x, y) => x[0] - y[0] || x[1] - y[1]);
    const merged = [];
    for (const [start, end] of all) {
      if (merged.length && start <= merged[merged.length - 1][1]) {
        merged[merged.length - 1] = [merged[merged.length - 1][0], Math.max(merged[merged.length - 1][1], end)];
      } else {
        merged.push([start, end]);
      }
    }
    this.ranges = merged;
    return merged.length === 1 && merged[0][0] === 0 && merged[0][1] === this.total;
  }
}

/**
 * One stream's receiving half (core.receiver.EloquentReceiver): datagrams and the clock in, events that became
 * renderable out ({index, payload, kind}), in order, each once; cumulative acks, at once by default.
 */
export class EloquentReceiver {
  constructor(streamId = 0, { limits = DEFAULT_LIMITS, ackDelay = 0 } = {}) {
    this.streamId = streamId;
    this.limits = limits;
    this.ackDelay = ackDelay;
    this.stats = { dataPackets: 0, keepalives: 0, undecodable: 0, duplicateEntries: 0, acksSent: 0 };
    this.next = 0;
    this.buffer = new Map();
    this.bufferedBytes = 0;
    this.fragments = new Map();
    this.references = new Map();
    this.referenceFloor = -1;
    this.finalIndex = null;
    this.largestPacket = -1;
    this.largestReceivedAt = 0;
    this.ackPending = false;
    this.ackDeadline = null;
  }

  receiveDatagram(data, now) {
    return this.receivePacket(decodePacket(data, this.limits), now);
  }

  receivePacket(packet, now) {
    if (packet.streamId !== this.streamId) {
      throw new ProtocolViolation(`packet for stream ${packet.streamId} delivered to stream ${this.streamId}`);
    }
    if (packet.type === "keepalive") {
      this.stats.keepalives += 1;
      return [];
    }
    if (packet.type === "ack") throw new ProtocolViolation("a receiver does not accept acks");
    this.stats.dataPackets += 1;
    if (packet.packetNumber > this.largestPacket) {
      this.largestPacket = packet.packetNumber;
      this.largestReceivedAt = now;
    }
    if (packet.refIndex !== null && packet.refIndex > this.referenceFloor) {
      this.referenceFloor = Math.min(packet.refIndex, this.next - 1);
    }
    const urgent = this.apply(packet);
    const delivered = this.deliver();
    this.pruneReferences();
    this.scheduleAck(now, urgent || this.buffer.size > 0 || this.complete);
    return delivered;
  }

  apply(packet) {
    const limits = this.limits;
    let previous = packet.refIndex !== null ? this.known(packet.refIndex) : null;
    let gap = false;
    for (const entry of packet.entries) {
      const index = entry.index;
      if (this.finalIndex !== null && index > this.finalIndex) {
        throw new ProtocolViolation(`event ${index} after the final event ${this.finalIndex}`);
      }
      if (entry.kind !== EventKind.DATA && this.finalIndex !== null && this.finalIndex !== index) {
        throw new ProtocolViolation(`second final event at ${index} (first at ${this.finalIndex})`);
      }
      if (index - this.next > limits.maxIndexGap) {
        throw new LimitExceeded(`event ${index} is ${index - this.next} past the next expected (maxIndexGap=${limits.maxIndexGap})`);
      }
      const known = this.known(index);
      if (known !== null) {
        this.stats.duplicateEntries += 1;
        previous = known;
        continue;
      }
      const stale = index < this.next;
      if (entry.fragTotal > 0) {
        if (stale) {
          this.stats.duplicateEntries += 1;
          previous = null;
          continue;
        }
        previous = this.addFragment(index, entry.kind, entry.fragTotal, entry.fragOffset, entry.middle);
        gap = gap || index > this.next;
        continue;
      }
      let payload;
      if (entry.delta) {
        if (previous === null) {
          this.stats.undecodable += 1;
          return true;
        }
        if (entry.prefix + entry.suffix > previous.length) {
          throw new ProtocolViolation(`event ${index}: delta takes ${entry.prefix + entry.suffix} bytes from a ${previous.length}-byte reference`);
        }
        payload = applyDelta(previous, entry.prefix, entry.suffix, entry.middle);
      } else {
        payload = entry.middle;
      }
      if (stale) {
        this.stats.duplicateEntries += 1;
      } else {
        this.store(index, entry.kind, payload);
        gap = gap || index > this.next;
      }
      previous = payload;
    }
    return gap;
  }

  known(index) {
    if (index < this.next) return this.references.get(index) ?? null;
    const held = this.buffer.get(index);
    return held !== undefined ? held[1] : null;
  }

  store(index, kind, payload) {
    if (this.bufferedBytes + payload.length > this.limits.maxBufferedBytes) {
      throw new LimitExceeded(`receiver buffer above maxBufferedBytes=${this.limits.maxBufferedBytes}`);
    }
    if (kind !== EventKind.DATA) {
      this.finalIndex = index;
      for (const i of this.buffer.keys()) {
        if (i > index) throw new ProtocolViolation(`events buffered past the final event ${index}`);
      }
    }
    this.buffer.set(index, [kind, payload]);
    this.bufferedBytes += payload.length;
  }

  addFragment(index, kind, total, offset, piece) {
    let frags = this.fragments.get(index);
    if (frags === undefined) {
      let pending = 0;
      for (const f of this.fragments.values()) pending += f.total;
      if (pending + total + this.bufferedBytes > this.limits.maxBufferedBytes) {
        throw new LimitExceeded("fragmented events above maxBufferedBytes");
      }
      frags = new Fragments(total, kind);
      this.fragments.set(index, frags);
    } else if (frags.total !== total || frags.kind !== kind) {
      throw new ProtocolViolation(`event ${index}: fragments disagree on size or kind`);
    }
    if (frags.add(offset, piece)) {
      this.fragments.delete(index);
      const payload = frags.data;
      this.store(index, kind, payload);
      return payload;
    }
    return null;
  }

  deliver() {
    const out = [];
    while (this.buffer.has(this.next)) {
      const [kind, payload] = this.buffer.get(this.next);
      this.buffer.delete(this.next);
      this.bufferedBytes -= payload.length;
      this.references.set(this.next, payload);
      out.push({ index: this.next, payload, kind });
      this.next += 1;
    }
    return out;
  }

  pruneReferences() {
    const floor = Math.max(this.referenceFloor - REFERENCE_SLACK, this.next - 1 - this.limits.maxIndexGap);
    if (this.references.size > 1) {
      for (const i of [...this.references.keys()]) if (i < floor) this.references.delete(i);
    }
  }

  scheduleAck(now, urgent) {
    this.ackPending = true;
    const due = urgent || this.ackDelay <= 0 ? now : now + this.ackDelay;
    this.ackDeadline = this.ackDeadline === null ? due : Math.min(this.ackDeadline, due);
  }

  nextDeadline() {
    return this.ackPending ? this.ackDeadline : null;
  }

  /** Acks due at `now` (encoded datagrams). */
  datagramsToSend(now) {
    if (!this.ackPending || this.ackDeadline === null || now < this.ackDeadline) return [];
    this.ackPending = false;
    this.ackDeadline = null;
    this.stats.acksSent += 1;
    return [encodePacket({ type: "ack", streamId: this.streamId, nextExpected: this.next,
      largestPacketNumber: this.largestPacket, ackDelay: Math.max(0, now - this.largestReceivedAt) })];
  }

  get nextExpected() {
    return this.next;
  }
  /** The final event has been delivered. */
  get complete() {
    return this.finalIndex !== null && this.next > this.finalIndex;
  }
}

// ============================================================================================== assembler
/**
 * Client side of an Eloquent response (core.assembler.EloquentAssembler): datagrams and control records in,
 * renderable events out, in order, each once; the trailer's digest checked at the end (IncompleteStream).
 */
export class EloquentAssembler {
  constructor(streamId, limits = DEFAULT_LIMITS) {
    this.receiver = new EloquentReceiver(streamId, { limits });
    this.control = new ControlParser({ maxRecordBytes: limits.maxBufferedBytes * 2 });
    this.trailer = null;
    this.fallbackEvents = 0;
    this.next = 0;
    this.pending = new Map();
    this.digest = new StreamDigest();
    this.final = null;
  }
  onDatagram(data, now) {
    return this.render(this.receiver.receiveDatagram(data, now));
  }
  onControl(data) {
    let out = [];
    for (const record of this.control.feed(data)) {
      if (record.type === "trailer") {
        if (this.trailer !== null) throw new IncompleteStream("two trailers on one stream");
        this.trailer = record;
        this.stash([record.final]);
      } else {
        this.fallbackEvents += record.events.length;
        this.stash(record.events);
      }
      out = out.concat(this.drain());
    }
    this.check();
    return out;
  }
  acks(now) {
    return this.receiver.datagramsToSend(now);
  }
  stash(events) {
    for (const e of events) if (e.index >= this.next) this.pending.set(e.index, e);
  }
  render(events) {
    let out = events.filter((e) => e.index >= this.next && this.final === null);
    for (const e of out) this.take(e);
    out = out.concat(this.drain());
    this.check();
    return out;
  }
  drain() {
    const out = [];
    while (this.final === null && this.pending.has(this.next)) {
      const e = this.pending.get(this.next);
      this.pending.delete(this.next);
      this.take(e);
      out.push(e);
    }
    return out;
  }
  take(e) {
    this.digest.update(e.payload);
    this.next = e.index + 1;
    this.pending.delete(e.index);
    if (e.kind !== EventKind.DATA) this.final = e;
  }
  check() {
    if (this.final === null || this.trailer === null) return;
    if (this.digest.count !== this.trailer.count || this.digest.hexdigest() !== this.trailer.sha256) {
      throw new IncompleteStream(`stream digest mismatch: got ${this.digest.count} events, trailer says ${this.trailer.count}`);
    }
  }
  /** The final event is rendered and the trailer confirmed every event. */
  get complete() {
    return this.final !== null && this.trailer !== null;
  }
  onStreamEnd() {
    this.control.close();
    if (!this.complete) {
      const missing = this.trailer === null ? "no trailer" : `events from ${this.next} missing`;
      throw new IncompleteStream(`the response stream ended before the stream was complete (${missing})`);
    }
  }
}

// ============================================================================================== SSE parser
/**
 * Incremental Server-Sent Events parser (WHATWG HTML "Parsing an event stream"; core.sse_reader.SSEParser):
 * bytes in any split, messages {data, event, id, retry, comments, raw} out.
 */
export class SSEParser {
  constructor({ maxMessageBytes = 1 << 22 } = {}) {
    this.maxMessageBytes = maxMessageBytes;
    this.lastEventId = null;
    this.retry = null;
    this.commentsSeen = 0;
    this.buf = new Uint8Array(0);
    this.raw = [];
    this.rawLength = 0;
    this.started = false;
    this.data = [];
    this.event = "";
    this.hasField = false;
    this.retryThis = null;
    this.comments = [];
    this.pendingCr = false;
  }

  feed(chunk) {
    chunk = asBytes(chunk);
    if (!chunk.length) return [];
    let buf = this.buf.length ? concatBytes([this.buf, chunk]) : chunk;
    if (!this.started) {
      const bom = [0xef, 0xbb, 0xbf];
      if (buf.length < 3 && buf.every((b, i) => b === bom[i])) {
        this.buf = buf.slice();
        return [];
      }
      if (buf[0] === 0xef && buf[1] === 0xbb && buf[2] === 0xbf) buf = buf.subarray(3);
      this.started = true;
    }
    const out = [];
    const n = buf.length;
    let pos = 0, lf = -1, cr = -1;
    while (pos < n) {
      if (this.pendingCr) {
        this.pendingCr = false;
        if (buf[pos] === 0x0a) {
          if (this.rawLength) this.addRaw(Uint8Array.of(0x0a));
          pos += 1;
          continue;
        }
      }
      if (lf < pos) {
        lf = buf.indexOf(0x0a, pos);
        if (lf < 0) lf = n;
      }
      if (cr < pos) {
        cr = buf.indexOf(0x0d, pos);
        if (cr < 0) cr = n;
      }
      if (lf === cr) break;
      let end, next;
      if (lf < cr) {
        end = lf;
        next = lf + 1;
      } else {
        end = cr;
        if (cr + 1 < n) {
          next = buf[cr + 1] === 0x0a ? cr + 2 : cr + 1;
        } else {
          next = cr + 1;
          this.pendingCr = true;
        }
      }
      const line = buf.subarray(pos, end);
      this.addRaw(buf.subarray(pos, next));
      pos = next;
      const message = this.line(line);
      if (message !== null) out.push(message);
    }
    this.buf = buf.slice(pos);
    if (this.buf.length > this.maxMessageBytes || this.rawLength > this.maxMessageBytes) {
      throw new LimitExceeded(`SSE message above ${this.maxMessageBytes} bytes`);
    }
    return out;
  }

  addRaw(bytes) {
    this.raw.push(bytes.slice());
    this.rawLength += bytes.length;
  }

  line(line) {
    if (!line.length) {
      const raw = concatBytes(this.raw);
      this.raw = [];
      this.rawLength = 0;
      return this.dispatch(raw);
    }
    const text = utf8Lenient.decode(line);
    if (text[0] === ":") {
      this.comments.push(text.slice(1).replace(/^ +/, ""));
      this.commentsSeen += 1;
      return null;
    }
    const colon = text.indexOf(":");
    const name = colon < 0 ? text : text.slice(0, colon);
    let value = colon < 0 ? "" : text.slice(colon + 1);
    if (colon >= 0 && value.startsWith(" ")) value = value.slice(1);
    if (name === "data") {
      this.data.push(value);
      this.hasField = true;
    } else if (name === "event") {
      this.event = value;
    } else if (name === "id") {
      if (!value.includes("\0")) this.lastEventId = value;
    } else if (name === "retry" && /^[0-9]+$/.test(value)) {
      this.retry = this.retryThis = parseInt(value, 10);
    }
    return null;
  }

  dispatch(raw) {
    const { data, event, comments, retryThis } = this;
    this.data = [];
    this.event = "";
    this.comments = [];
    this.retryThis = null;
    const had = this.hasField;
    this.hasField = false;
    if (!had) return null;
    return { data: data.join("\n"), event: event || "message", id: this.lastEventId, retry: retryThis, comments, raw };
  }
}

// ============================================================================================== codecs
/** Python's str() for the JSON values an engine puts in an error field. */
function pyStr(v) {
  if (typeof v === "string") return v;
  if (v === null || v === undefined) return "None";
  if (v === true) return "True";
  if (v === false) return "False";
  return typeof v === "number" ? String(v) : JSON.stringify(v);
}
function view(fields = {}) {
  return { text: "", tokenIds: [], finishReason: null, usage: null, error: null, errorType: null, terminal: false,
    ...fields };
}
function loadJson(payload) {
  try {
    return JSON.parse(typeof payload === "string" ? payload : utf8Strict.decode(payload));
  } catch (err) {
    throw new CodecError(`event payload is not JSON: ${err.message}`);
  }
}
/** Python's truthiness of a JSON value (`x or default`). */
function pyTruthy(v) {
  if (Array.isArray(v)) return v.length > 0;
  if (isObject(v)) return Object.keys(v).length > 0;
  return Boolean(v);
}

/** OpenAI chat/completions chunks (vLLM, TGI's chat route, the built-in engine). */
export const OpenAICodec = {
  name: "openai",
  parse(payload) {
    const text = typeof payload === "string" ? payload : decodeUtf8(payload);
    const stripped = text.replace(/^[ \t\n\r\x0b\x0c]+|[ \t\n\r\x0b\x0c]+$/g, "");
    if (stripped === "[DONE]") return view({ terminal: true });
    return this.read(loadJson(payload));
  },
  read(obj) {
    if (!isObject(obj)) throw new CodecError("OpenAI chunk must be a JSON object");
    const error = obj.error;
    if (error !== undefined && error !== null) {
      if (isObject(error)) return view({ error: pyStr(error.message ?? ""), errorType: pyStr(error.type ?? "") });
      return view({ error: pyStr(error) });
    }
    const text = [];
    const tokenIds = [];
    let finish = null;
    const choices = pyTruthy(obj.choices) ? obj.choices : [];
    if (!Array.isArray(choices)) throw new CodecError("'choices' must be a list");
    for (const choice of choices) {
      if (!isObject(choice)) throw new CodecError("each choice must be an object");
      const delta = choice.delta;
      const piece = isObject(delta) ? delta.content : choice.text;
      if (typeof piece === "string") text.push(piece);
      const ids = choice.token_ids;
      if (Array.isArray(ids)) for (const i of ids) if (Number.isInteger(i) || typeof i === "boolean") tokenIds.push(Number(i));
      if (choice.finish_reason !== undefined && choice.finish_reason !== null) finish = pyStr(choice.finish_reason);
    }
    return view({ text: text.join(""), tokenIds, finishReason: finish, usage: isObject(obj.usage) ? obj.usage : null });
  },
};

/** Text Generation Inference /generate_stream events. */
export const TGICodec = {
  name: "tgi",
  parse(payload) {
    return this.read(loadJson(payload));
  },
  read(obj) {
    if (!isObject(obj)) throw new CodecError("TGI event must be a JSON object");
    if (Object.hasOwn(obj, "error")) return view({ error: pyStr(obj.error), errorType: pyStr(pyTruthy(obj.error_type) ? obj.error_type : "") });
    const token = obj.token;
    if (!isObject(token)) throw new CodecError("TGI event has no 'token' object");
    const text = Object.hasOwn(token, "text") ? token.text : "";
    const details = obj.details;
    const finish = isObject(details) ? details.finish_reason ?? null : null;
    const usage = isObject(details) && Object.hasOwn(details, "generated_tokens")
      ? { completion_tokens: details.generated_tokens } : null;
    return view({ text: pyTruthy(token.special) ? "" : pyStr(text),
      tokenIds: Number.isInteger(token.id) || typeof token.id === "boolean" ? [Number(token.id)] : [],
      finishReason: finish !== null ? pyStr(finish) : null, usage });
  },
};

export const TEXT_OUTPUTS = ["text_output", "OUTPUT", "output", "text"];

/** Triton generate_stream events. */
export const TritonCodec = {
  name: "triton",
  parse(payload) {
    return this.read(loadJson(payload));
  },
  read(obj) {
    if (!isObject(obj)) throw new CodecError("Triton event must be a JSON object");
    if (Object.hasOwn(obj, "error")) return view({ error: pyStr(obj.error) });
    for (const key of TEXT_OUTPUTS) {
      const value = obj[key];
      if (typeof value === "string") return view({ text: value });
      if (Array.isArray(value) && value.every((v) => typeof v === "string")) return view({ text: value.join("") });
    }
    return view();
  },
};

export const CODECS = Object.freeze({ openai: OpenAICodec, tgi: TGICodec, triton: TritonCodec });

/** The codec whose format a decoded event has (core.codecs.sniff_codec). */
export function sniffCodec(obj) {
  if (!isObject(obj)) return null;
  if (Object.hasOwn(obj, "choices")) return OpenAICodec;
  if (Object.hasOwn(obj, "token")) return TGICodec;
  if (Object.hasOwn(obj, "model_name") || TEXT_OUTPUTS.some((k) => Object.hasOwn(obj, k))) return TritonCodec;
  return null;
}

/** The text an event's data adds (OpenAI, TGI or Triton), or null (role chunks, [DONE], errors, other JSON). */
export function textDelta(data) {
  if (!data || data[0] !== "{") return null;
  let obj;
  try {
    obj = JSON.parse(data);
  } catch {
    return null;
  }
  const codec = sniffCodec(obj);
  if (codec === null) return null;
  try {
    return codec.read(obj).text || null;
  } catch (err) {
    if (err instanceof CodecError) return null;
    throw err;
  }
}

// ============================================================================================== event ids
const TOKEN_RE = /^[A-Za-z0-9_-]{16,64}$/;

export function formatEventId(token, index) {
  return `${token}:${index}`;
}
/** `<token>:<index>` (or a bare `<token>`: from the start) -> {token, after}; BadEventId otherwise. */
export function parseEventId(value) {
  const v = value.trim();
  const colon = v.lastIndexOf(":");
  const token = colon < 0 ? v : v.slice(0, colon);
  const index = colon < 0 ? "-1" : v.slice(colon + 1);
  if (!TOKEN_RE.test(token)) throw new BadEventId("Last-Event-ID is not an id this server issued");
  if (!(/^[0-9]+$/.test(index) || index === "-1") || index.length > 18) {
    throw new BadEventId("Last-Event-ID has a malformed event index");
  }
  return { token, after: Number(index) };
}
function resumePoint(id) {
  if (!id) return null;
  try {
    const point = parseEventId(id);
    return point.after >= 0 ? point : null;
  } catch (err) {
    if (err instanceof BadEventId) return null;
    throw err;
  }
}

// ============================================================================================== client
import { FallbackReason, fallback, openFailure, unavailable } from "./fallback.js";

export { FALLBACK_HEADER, FallbackReason } from "./fallback.js";

// origin -> {until (ms), fallback, failures}: WebTransport is not tried again before `until`; each failure in a row
// doubles the wait (retryAfter, 2x, ... up to rememberFailure), a session that opens forgets them.
const FAILED_ORIGINS = new Map();
const DEFAULT_OPTIONS = Object.freeze({
  transport: "auto", headers: {}, sessionPath: "/eloquent/wt", certificateHash: "auto",
  webTransportTimeout: 1000, webTransportPort: null, retryAfter: 5000, rememberFailure: 60 * 1000, sseFallback: true,
  resume: true, maxRetries: 8, backoff: 100, limits: null, fetch: null, WebTransport: null,
});
const nowSeconds = () => (globalThis.performance ? performance.now() : Date.now()) / 1000;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Forget WebTransport failures remembered for every origin (tests). */
export function forgetWebTransportFailures() {
  FAILED_ORIGINS.clear();
}

function headerObject(headers) {
  const out = {};
  if (!headers) return out;
  if (typeof headers.forEach === "function" && !Array.isArray(headers)) {
    headers.forEach((value, key) => { out[key.toLowerCase()] = value; });
  } else {
    for (const [key, value] of Array.isArray(headers) ? headers : Object.entries(headers)) out[key.toLowerCase()] = String(value);
  }
  return out;
}
function parseBody(bytes) {
  const text = decodeUtf8(bytes);
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}
function isAbort(err, signal) {
  return (signal && signal.aborted) || (err && err.name === "AbortError");
}

const QUEUE_END = Symbol("end");
class QueueFailure {
  constructor(error) {
    this.error = error;
  }
}
/** An async queue: the transport pushes events, a QueueFailure or QUEUE_END; the reader pulls. */
class EventQueue {
  constructor() {
    this.items = [];
    this.waiter = null;
  }
  push(item) {
    this.items.push(item);
    if (this.waiter) {
      const wake = this.waiter;
      this.waiter = null;
      wake();
    }
  }
  async next() {
    while (!this.items.length) await new Promise((resolve) => { this.waiter = resolve; });
    return this.items.shift();
  }
}

/** The event a stream yields: {index, data, kind ("data"|"error"), event, id, renderedAt, text, error, json}. */
function clientEvent(index, data, renderedAt, { kind = "data", event = "message", id = null } = {}) {
  return {
    index, data, kind, event, id, renderedAt,
    get json() {
      try {
        return JSON.parse(this.data);
      } catch {
        return null;
      }
    },
    get text() {
      return textDelta(this.data);
    },
    get error() {
      const obj = this.json;
      return isObject(obj) && Object.hasOwn(obj, "error") ? obj.error : null;
    },
  };
}

/** Marks a WebTransport delivery that broke mid-stream (the stream goes on over SSE). */
class SessionLost extends ClientError {}

/** Plain SSE over fetch with Last-Event-ID resume (eloquent_client.sse.stream_sse): each event exactly once. */
class SSESource {
  constructor(client, request, { token = null, lastId = null } = {}) {
    this.client = client;
    this.request = request;
    this.token = token;
    this.lastId = lastId;
    this.lastPoint = resumePoint(lastId);
    this.failures = 0;
    this.count = 0;
    this.response = null; // a response whose body is still to read
    this.headers = {};
    this.status = null;
    this.requests = 0;
  }

  /** One request; null for a 204 (nothing to stream). */
  async connect() {
    const { method, url, body, headers, signal } = this.request;
    const sent = { accept: "text/event-stream", "cache-control": "no-store", ...headers };
    if (this.lastId !== null) sent["last-event-id"] = this.lastId;
    else if (this.token !== null) sent["last-event-id"] = this.token; // nothing received yet: from the start
    const resuming = "last-event-id" in sent;
    this.requests += 1;
    const response = await this.client.fetch(url, { method, headers: sent, body, signal });
    this.client.noteAltSvc(response.headers);
    if (this.status === null) {
      this.status = response.status;
      this.headers = headerObject(response.headers);
    }
    if (response.status === 204) return null;
    if (response.status !== 200) {
      const detail = parseBody(new Uint8Array(await response.arrayBuffer()));
      const what = resuming ? "resume" : "stream";
      throw new HTTPStatusError(response.status, detail,
        `${what} failed with HTTP ${response.status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
    }
    this.token = response.headers.get(STREAM_HEADER) ?? this.token;
    return response;
  }

  /** Connect (retrying while it may) so that `client.stream()` raises HTTPStatusError at once. */
  async open() {
    for (;;) {
      try {
        this.response = await this.connect();
        this.opened = true;
        return this;
      } catch (err) {
        await this.retryOrThrow(err);
      }
    }
  }

  /** A transport error: wait and let the caller reconnect, or throw when resuming is not possible. */
  async retryOrThrow(err) {
    if (err instanceof EloquentError || isAbort(err, this.request.signal)) throw err;
    const opts = this.client.options;
    const canResume = opts.resume && (this.lastId !== null || this.token !== null);
    if (!canResume || this.failures >= opts.maxRetries) {
      if (this.lastId !== null || this.count) {
        throw new IncompleteStream(`the stream was cut after event ${this.lastId} and could not be resumed: ${err && err.message}`, { cause: err });
      }
      throw new ClientError(`${this.request.method} ${this.request.url} failed: ${err && err.message}`, { cause: err });
    }
    this.failures += 1;
    await sleep(opts.backoff * 2 ** (this.failures - 1));
  }

  /** Close a response nobody read. */
  cancel() {
    const response = this.response;
    this.response = null;
    this.opened = false;
    if (response && response.body && !response.bodyUsed) response.body.cancel().catch(() => {});
  }

  async *events() {
    let response = this.opened ? this.response : undefined;
    this.opened = false;
    this.response = null;
    for (;;) {
      let reader = null;
      try {
        if (response === undefined) response = await this.connect();
        if (response === null) return;
        reader = response.body.getReader();
        response = undefined;
        const parser = new SSEParser();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) {
            reader = null;
            return;
          }
          const now = nowSeconds();
          for (const message of parser.feed(value)) {
            const point = resumePoint(message.id);
            const last = this.lastPoint;
            if (point && last && point.token === last.token && point.after <= last.after) continue; // a repeat
            if (message.id !== null) {
              this.lastId = message.id;
              this.lastPoint = point;
            }
            this.failures = 0;
            const index = point ? point.after : this.count;
            this.count += 1;
            yield clientEvent(index, message.data, now, { event: message.event, id: message.id });
            if (message.data === "[DONE]") return;
          }
        }
      } catch (err) {
        if (reader) reader.cancel().catch(() => {});
        reader = null;
        response = undefined;
        await this.retryOrThrow(err);
      } finally {
        if (reader) reader.cancel().catch(() => {}); // the reader stopped early: close the response
      }
    }
  }
}

/** One WebTransport session: routes datagrams to its streams by stream id, sends their acks. */
class WTSession {
  static async open(client, url, hashes) {
    const WT = client.options.WebTransport ?? globalThis.WebTransport;
    const why = unavailable(WT);
    if (why) throw Object.assign(new ClientError(`WebTransport is not available here: ${why.message}`), { fallback: why });
    const init = hashes ? { serverCertificateHashes: hashes } : {};
    let wt;
    try {
      wt = new WT(url, init);
    } catch (err) {
      throw Object.assign(new ClientError(`WebTransport to ${url} failed: ${err && err.message}`, { cause: err }),
        { fallback: openFailure(err) });
    }
    Promise.resolve(wt.ready).catch(() => {}); // observed below; keeps a late rejection from going unhandled
    Promise.resolve(wt.closed).catch(() => {});
    let timer;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => {
        const err = new ClientError(`WebTransport session to ${url} not ready within ${client.options.webTransportTimeout} ms`);
        reject(Object.assign(err, { fallback: openFailure(err, { timedOut: true }) }));
      }, client.options.webTransportTimeout);
    });
    try {
      await Promise.race([wt.ready, timeout]);
    } catch (err) {
      try { wt.close(); } catch { /* already closed */ }
      if (err instanceof ClientError) throw err;
      throw Object.assign(new ClientError(`WebTransport to ${url} failed: ${err && err.message}`, { cause: err }),
        { fallback: openFailure(err) });
    } finally {
      clearTimeout(timer);
    }
    return new WTSession(wt, client);
  }

  constructor(wt, client) {
    this.wt = wt;
    this.client = client;
    this.streams = new Map();
    this.early = [];
    this.lost = null;
    this.writer = wt.datagrams.writable.getWriter();
    this.readDatagrams(); // at once: Chromium does not hold early datagrams long
    Promise.resolve(wt.closed).then(
      () => this.onLost(new SessionLost("the WebTransport session closed")),
      (err) => this.onLost(new SessionLost(`the WebTransport session failed: ${err && err.message}`, { cause: err })));
  }

  async readDatagrams() {
    const reader = this.wt.datagrams.readable.getReader();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        this.route(asBytes(value), nowSeconds());
      }
    } catch (err) {
      this.onLost(new SessionLost(`WebTransport datagrams failed: ${err && err.message}`, { cause: err }));
    }
  }

  route(data, now) {
    let streamId;
    try {
      streamId = peekStreamId(data);
    } catch {
      return; // not an Eloquent packet: nothing this side can do with it
    }
    const stream = this.streams.get(streamId);
    if (stream) stream.onDatagram(data, now);
    else {
      this.early.push([streamId, data, now]); // overtook its status line (or a finished stream's late copy)
      if (this.early.length > 256) this.early.shift();
    }
  }

  register(streamId, stream) {
    this.streams.set(streamId, stream);
    const early = this.early.filter(([id]) => id === streamId);
    this.early = this.early.filter(([id]) => id !== streamId);
    for (const [, data, at] of early) stream.onDatagram(data, at);
  }

  unregister(streamId, stream) {
    if (this.streams.get(streamId) !== stream) return; // the id went on to a newer request
    this.streams.delete(streamId);
    this.early = this.early.filter(([id]) => id !== streamId);
  }

  send(datagram) {
    if (this.lost) return;
    this.writer.write(datagram).catch(() => {});
  }

  onLost(error) {
    if (this.lost) return;
    this.lost = error;
    if (this.client.session === this) this.client.session = null;
    for (const stream of [...this.streams.values()]) stream.onSessionLost(error);
  }

  close() {
    this.onLost(new SessionLost("closed by the client"));
    try { this.wt.close(); } catch { /* already closed */ }
  }
}

/** One request over a WebTransport session: status line + control records on a bidi stream, events as datagrams. */
class WTRequest {
  constructor(session, request) {
    this.session = session;
    this.request = request;
    this.queue = new EventQueue();
    this.phase = "awaiting"; // awaiting -> receiving -> (complete ->) ended | failed
    this.assembler = null;
    this.streamId = null;
    this.status = null;
    this.headers = {};
    this.token = null;
    this.stats = { datagrams: 0, acksSent: 0, fallbackEvents: 0 };
  }

  /** Send the request, read the status line; resolves once events may come (the pump then runs alone). */
  async start() {
    try {
      return await this.open();
    } catch (err) {
      this.phase = "failed";
      if (this.streamId !== null) this.session.unregister(this.streamId, this);
      this.reader?.cancel().catch(() => {});
      throw err;
    }
  }

  async open() {
    const { method, path, headers, body } = this.request;
    const bidi = await this.session.wt.createBidirectionalStream();
    const writer = bidi.writable.getWriter();
    const head = JSON.stringify({ method, path, headers: { ...headers, [TRANSPORT_HEADER]: DATAGRAM, accept: "text/event-stream" } });
    await writer.write(utf8.encode(head + "\n"));
    if (body !== undefined && body !== null) await writer.write(asBytes(body));
    await writer.close();
    this.reader = bidi.readable.getReader();
    let pending = new Uint8Array(0);
    let newline = -1;
    while (newline < 0) {
      const { value, done } = await this.reader.read();
      if (done) throw new SessionLost("the WebTransport stream ended before its status line");
      pending = concatBytes([pending, asBytes(value)]);
      newline = pending.indexOf(0x0a);
      if (newline < 0 && pending.length > 1 << 16) throw new ProtocolError("WebTransport status line too long");
    }
    let line;
    try {
      line = JSON.parse(utf8Strict.decode(pending.subarray(0, newline)));
    } catch {
      throw new ProtocolError("the WebTransport status line is not JSON");
    }
    if (!isObject(line) || !Number.isInteger(line.status)) throw new ProtocolError("bad WebTransport status line");
    this.status = line.status;
    this.headers = headerObject(line.headers || {});
    this.token = this.headers[STREAM_HEADER] ?? null;
    let rest = pending.subarray(newline + 1);
    if (this.status !== 200) {
      const parts = [rest];
      for (;;) {
        const { value, done } = await this.reader.read();
        if (done) break;
        parts.push(asBytes(value));
      }
      const detail = parseBody(concatBytes(parts));
      throw new HTTPStatusError(this.status, detail, `HTTP ${this.status} from ${method} ${path}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
    }
    if (this.headers[TRANSPORT_HEADER] === DATAGRAM) {
      if (!Number.isInteger(line.stream_id)) throw new ProtocolError("WebTransport status line without stream_id");
      this.streamId = line.stream_id;
      this.assembler = new EloquentAssembler(this.streamId, this.session.client.limits);
      this.phase = "receiving";
      this.session.register(this.streamId, this);
    } else if ((this.headers["content-type"] || "").split(";")[0].trim().toLowerCase() === "text/event-stream") {
      this.sse = new SSEParser();
      this.sseCount = 0;
      this.phase = "receiving";
    } else {
      throw new ProtocolError(`unexpected WebTransport response (content-type ${this.headers["content-type"]})`);
    }
    if (rest.length) this.onControl(rest, nowSeconds());
    this.pump();
    return this;
  }

  async pump() {
    try {
      for (;;) {
        const { value, done } = await this.reader.read();
        if (done) break;
        this.onControl(asBytes(value), nowSeconds());
        if (this.phase === "failed") return;
      }
      if (this.phase === "failed") return;
      if (this.assembler) this.assembler.onStreamEnd();
      this.end();
    } catch (err) {
      if (this.phase === "complete") this.end();
      else this.fail(err instanceof EloquentError ? err : new SessionLost(`the WebTransport stream failed: ${err && err.message}`, { cause: err }));
    }
  }

  onControl(bytes, now) {
    if (this.phase === "ended" || this.phase === "failed") return;
    if (this.sse) {
      for (const m of this.sse.feed(bytes)) {
        const index = resumePoint(m.id)?.after ?? this.sseCount;
        this.sseCount += 1;
        this.queue.push(clientEvent(index, m.data, now, { event: m.event, id: m.id }));
      }
      return;
    }
    try {
      this.emit(this.assembler.onControl(bytes), now);
    } catch (err) {
      this.fail(err);
    }
  }

  onDatagram(data, now) {
    if (!this.assembler || this.phase === "ended" || this.phase === "failed") return;
    this.stats.datagrams += 1;
    try {
      this.emit(this.assembler.onDatagram(data, now), now);
    } catch (err) {
      this.fail(err);
      return;
    }
    for (const ack of this.assembler.acks(now)) {
      this.stats.acksSent += 1;
      this.session.send(ack);
    }
  }

  emit(events, now) {
    this.stats.fallbackEvents = this.assembler.fallbackEvents;
    for (const e of events) {
      if (e.kind === EventKind.END) continue;
      this.queue.push(clientEvent(e.index, decodeUtf8(e.payload), now, { kind: e.kind === EventKind.DATA ? "data" : "error" }));
    }
    if (this.assembler.complete && this.phase === "receiving") {
      this.phase = "complete";
      this.queue.push(QUEUE_END);
    }
  }

  end() {
    if (this.phase === "receiving") this.queue.push(QUEUE_END);
    if (this.phase !== "failed") this.phase = "ended";
    if (this.streamId !== null) this.session.unregister(this.streamId, this);
  }

  fail(error) {
    if (this.phase === "ended" || this.phase === "failed") return;
    if (this.phase === "complete") return this.end();
    this.phase = "failed";
    if (this.streamId !== null) this.session.unregister(this.streamId, this);
    this.queue.push(new QueueFailure(error));
    this.reader?.cancel().catch(() => {});
  }

  onSessionLost(error) {
    if (this.phase === "complete") this.end();
    else this.fail(error);
  }

  /** The reader is done with the stream: abandon it unless complete (then late datagrams are still acked until
   * the server ends the stream, so it stops probing at once). */
  cancel() {
    if (this.phase === "receiving" || this.phase === "awaiting") this.fail(new ClientError("cancelled"));
  }

  async *events() {
    for (;;) {
      const item = await this.queue.next();
      if (item === QUEUE_END) return;
      if (item instanceof QueueFailure) throw item.error;
      yield item;
    }
  }
}

/** A streaming response: iterate `events()` or `textDeltas()` once; `delivery` says how events came. */
export class EloquentStream {
  constructor(client, request, { sse = null, wt = null }) {
    this.client = client;
    this.request = request;
    this.sse = sse;
    this.wt = wt;
    /** "webtransport" or "sse"; "sse" after a WebTransport session broke mid-stream (then `fellBack`). */
    this.delivery = wt ? "webtransport" : "sse";
    this.status = wt ? wt.status : sse.status;
    this.headers = wt ? wt.headers : sse.headers;
    this.token = wt ? wt.token : sse.token;
    this.rendered = [];
    this.fellBack = false;
    this.consumed = false;
    /** Why this stream is not on WebTransport: null, or {reason, message, detail} (fallback.js). */
    this.fallback = null;
  }

  /** Index of the last event rendered, null before the first. */
  get lastIndex() {
    return this.rendered.length ? this.rendered[this.rendered.length - 1].index : null;
  }

  async *source() {
    if (!this.wt) {
      yield* this.sse.events();
      return;
    }
    let lost;
    try {
      yield* this.wt.events();
      return;
    } catch (err) {
      if (!(err instanceof SessionLost) || !this.client.options.sseFallback) throw err;
      lost = err;
    }
    // The session broke mid-stream: the same stream goes on over SSE after the last rendered event.
    const last = this.lastIndex;
    if (this.token === null && last !== null) {
      throw new IncompleteStream("the WebTransport session broke mid-stream and the server gave no resume token", { cause: lost });
    }
    this.fellBack = true;
    this.delivery = "sse";
    const lastId = this.token !== null && last !== null ? formatEventId(this.token, last) : null;
    this.sse = new SSESource(this.client, this.client.sseRequest(this.request), { token: this.token, lastId });
    await this.sse.open();
    yield* this.sse.events();
  }

  /** Each event once, as it becomes renderable: {index, data, kind, event, id, renderedAt, text, error, json}. */
  async *events() {
    if (this.consumed) throw new ClientError("the events of a response can be read only once");
    this.consumed = true;
    try {
      for await (const event of this.source()) {
        this.rendered.push(event);
        yield event;
      }
    } finally {
      this.cancel();
    }
  }

  /** The text of OpenAI/TGI/Triton events as it renders; an in-band error raises StreamFailed. */
  async *textDeltas() {
    for await (const event of this.events()) {
      if (event.kind === "error" || event.error !== null) {
        throw new StreamFailed(`the server reported an error: ${event.data}`, event.error ?? event.data);
      }
      const text = event.text;
      if (text) yield text;
    }
  }

  async text() {
    let out = "";
    for await (const t of this.textDeltas()) out += t;
    return out;
  }

  /** Abandon the stream: the WebTransport request is dropped, an SSE response closed. */
  cancel() {
    if (this.wt) this.wt.cancel();
    if (this.sse) this.sse.cancel();
  }
}

/**
 * `new EloquentClient(origin, {transport: "auto" | "webtransport" | "sse", ...})`; `await client.stream(path,
 * body, {headers})` gives an EloquentStream. Options: headers, sessionPath ("/eloquent/wt"), certificateHash
 * ("auto": GET /eloquent/cert-hash; null: the system's trust; a base64 string or bytes), webTransportTimeout (ms),
 * webTransportPort, retryAfter / rememberFailure (ms: the first and the longest wait before a failed origin is
 * tried again), sseFallback, resume, maxRetries, backoff (ms), limits, fetch,
 * WebTransport (both injectable).
 */
export class EloquentClient {
  constructor(origin, options = {}) {
    let url;
    try {
      url = new URL(origin);
    } catch {
      throw new ConfigError(`origin must be http(s)://host[:port], got ${JSON.stringify(origin)}`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") throw new ConfigError(`origin must be http(s), got ${origin}`);
    this.options = { ...DEFAULT_OPTIONS, ...options };
    if (!["auto", "webtransport", "sse"].includes(this.options.transport)) {
      throw new ConfigError(`transport must be auto, webtransport or sse, got ${JSON.stringify(this.options.transport)}`);
    }
    this.url = url;
    this.origin = url.origin;
    this.baseUrl = url.origin + url.pathname.replace(/\/+$/, "");
    this.limits = this.options.limits ? makeLimits(this.options.limits) : DEFAULT_LIMITS;
    this.session = null;
    this.sessionOpening = null;
    this.altSvcPort = null;
  }

  fetch(url, init) {
    const f = this.options.fetch ?? globalThis.fetch;
    return f(url, init);
  }

  /** Remember the HTTP/3 port an `Alt-Svc: h3=":PORT"` header names. */
  noteAltSvc(headers) {
    const value = headers && typeof headers.get === "function" ? headers.get("alt-svc") : null;
    if (!value) return;
    const match = /(?:^|,)\s*h3="([^":]*):(\d+)"/.exec(value);
    if (match && (!match[1] || match[1] === this.url.hostname)) this.altSvcPort = Number(match[2]);
  }

  webTransportUrl() {
    const port = this.options.webTransportPort ?? this.altSvcPort ?? (this.url.port || (this.url.protocol === "https:" ? 443 : 80));
    const host = this.url.hostname.includes(":") ? `[${this.url.hostname}]` : this.url.hostname;
    return `https://${host}:${port}${this.url.pathname.replace(/\/+$/, "")}${this.options.sessionPath}`;
  }

  /** serverCertificateHashes for the session, or null (the system's roots). */
  async certificateHashes() {
    const option = this.options.certificateHash;
    if (option === null || option === undefined || option === false) return null;
    const value = (v) => (typeof v === "string" ? base64Decode(v) : asBytes(v));
    if (Array.isArray(option)) return option.map((h) => ({ algorithm: h.algorithm, value: value(h.value) }));
    if (option !== "auto") return [{ algorithm: "sha-256", value: value(option) }];
    const page = globalThis.location?.origin;
    if (page !== undefined && page !== this.origin) return null; // only a same-origin page asks the server
    try {
      const response = await this.fetch(`${this.baseUrl}/eloquent/cert-hash`, { headers: { accept: "application/json" } });
      this.noteAltSvc(response.headers);
      if (response.status !== 200) return null;
      const body = await response.json();
      if (!isObject(body) || body.algorithm !== "sha-256" || typeof body.value !== "string") return null;
      return [{ algorithm: "sha-256", value: base64Decode(body.value) }];
    } catch {
      return null;
    }
  }

  async openSession() {
    if (this.session && !this.session.lost) return this.session;
    if (!this.sessionOpening) {
      this.sessionOpening = (async () => {
        const hashes = await this.certificateHashes();
        return WTSession.open(this, this.webTransportUrl(), hashes);
      })();
    }
    try {
      this.session = await this.sessionOpening;
      return this.session;
    } finally {
      this.sessionOpening = null;
    }
  }

  webTransportAvailable() {
    return typeof (this.options.WebTransport ?? globalThis.WebTransport) === "function";
  }

  sseRequest(request) {
    return { method: request.method, url: this.baseUrl + request.path, body: request.body, headers: request.headers,
      signal: request.signal };
  }

  /** Start a streaming request; resolves once the response head is in (HTTPStatusError for a non-200). */
  async stream(path, body, { headers = {}, method = "POST", signal } = {}) {
    const merged = { ...headerObject(this.options.headers), ...headerObject(headers) };
    let payload = body;
    if (body !== undefined && body !== null && typeof body === "object" && !(body instanceof Uint8Array)
        && !(body instanceof ArrayBuffer) && !ArrayBuffer.isView(body)) {
      payload = JSON.stringify(body);
      merged["content-type"] ??= "application/json";
    }
    const request = { method, path, body: payload, headers: merged, signal };
    const { transport } = this.options;
    let why = null; // why this stream is not on WebTransport (stays null when the caller asked for SSE)
    if (transport === "auto") {
      const remembered = FAILED_ORIGINS.get(this.origin);
      why = unavailable(this.options.WebTransport ?? globalThis.WebTransport);
      if (!why && remembered !== undefined && remembered.until > Date.now()) {
        why = fallback(FallbackReason.REMEMBERED, remembered.fallback.message);
      }
    }
    if (transport === "webtransport" || (transport === "auto" && !why)) {
      try {
        const session = await this.openSession();
        FAILED_ORIGINS.delete(this.origin);
        const wt = await new WTRequest(session, request).start();
        const stream = new EloquentStream(this, request, { wt });
        signal?.addEventListener("abort", () => stream.cancel(), { once: true });
        return stream;
      } catch (err) {
        if (transport === "webtransport" || err instanceof HTTPStatusError || isAbort(err, signal)) throw err;
        why = err.fallback ?? fallback(FallbackReason.SESSION_FAILED, err && err.message);
        const failures = (FAILED_ORIGINS.get(this.origin)?.failures ?? 0) + 1;
        const { retryAfter, rememberFailure } = this.options;
        const wait = Math.min(rememberFailure, retryAfter * 2 ** (failures - 1));
        FAILED_ORIGINS.set(this.origin, { until: Date.now() + wait, fallback: why, failures });
      }
    }
    const sse = await new SSESource(this, this.sseRequest(request)).open();
    const stream = new EloquentStream(this, request, { sse });
    stream.fallback = why;
    return stream;
  }

  close() {
    if (this.session) this.session.close();
    this.session = null;
  }
}
