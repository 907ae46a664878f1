/*
 * Mirrors core/sse_reader.py: an incremental Server-Sent Events parser (WHATWG HTML), bytes in any split, messages
 * out. Separate because both the SSE path and the WebTransport path's SSE body read with it.
 */

import { asBytes, concatBytes, decodeUtf8 } from "./bytes.js";
import { LimitExceeded } from "./errors.js";

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
    const text = decodeUtf8(line);
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
