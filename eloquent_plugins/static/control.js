/*
 * Mirrors core/control.py: the control records of the datagram path's reliable stream (the trailer with the
 * stream digest, fallback batches), one JSON object per line, and the digest itself. Separate because the
 * assembler reads them beside the datagrams, and the vectors test them alone.
 */

import { asBytes, base64Decode, base64Encode, concatBytes, decodeUtf8Strict, encodeUtf8, isObject } from "./bytes.js";
import { DecodeError, LimitExceeded } from "./errors.js";
import { EventKind } from "./events.js";
import { Sha256 } from "./sha256.js";

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
  return encodeUtf8(JSON.stringify({ type: "trailer", count: trailer.count, sha256: trailer.sha256,
    final: eventJson(trailer.final) }) + "\n");
}
export function encodeFallback(events) {
  return encodeUtf8(JSON.stringify({ type: "fallback", events: events.map(eventJson) }) + "\n");
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
      obj = JSON.parse(decodeUtf8Strict(line));
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
