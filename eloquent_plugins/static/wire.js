/*
 * Mirrors core/wire.py: Eloquent packets (docs/PROTOCOL.md) to and from bytes, the same bytes as the Python
 * encoder, and a decoder that raises only DecodeError / LimitExceeded whatever it is given. Separate because the
 * receiver decodes with it, the WebTransport session peeks stream ids with it, and the vectors test it alone.
 */

import { concatBytes, asBytes } from "./bytes.js";
import { DecodeError, InvalidArgument, LimitExceeded } from "./errors.js";
import { EventKind } from "./events.js";
import { DEFAULT_LIMITS } from "./limits.js";
import { MAX_VARINT, decodeVarint, encodeVarint } from "./varint.js";

export const VERSION = 1;
export const PacketType = Object.freeze({ DATA: 1, ACK: 2, KEEPALIVE: 3 });

const KIND_MASK = 0x03;
const FLAG_FRAGMENT = 0x04;
const FLAG_DELTA = 0x08;
const KNOWN_FLAGS = KIND_MASK | FLAG_FRAGMENT | FLAG_DELTA;
const MAX_SAFE = Number.MAX_SAFE_INTEGER;

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
