/*
 * The WebTransport path, no single Python mirror (the Python client speaks raw HTTP/3: client/eloquent_client/
 * http3.py and h3stream.py): a session that routes datagrams to its requests by stream id and sends their acks,
 * and a request (status line + control records on a bidirectional stream, events as datagrams, through the
 * assembler). Separate because it is the one piece that touches the browser's WebTransport API.
 */

import { EloquentAssembler } from "./assembler.js";
import { asBytes, concatBytes, decodeUtf8, decodeUtf8Strict, encodeUtf8, isObject } from "./bytes.js";
import { clientEvent, nowSeconds } from "./client_events.js";
import { ClientError, EloquentError, HTTPStatusError, ProtocolError, SessionLost } from "./errors.js";
import { EventKind } from "./events.js";
import { openFailure, unavailable } from "./fallback.js";
import { headerObject, parseBody } from "./http.js";
import { DATAGRAM, STREAM_HEADER, TRANSPORT_HEADER, resumePoint } from "./protocol.js";
import { SSEParser } from "./sse_reader.js";
import { peekStreamId } from "./wire.js";

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

/** One WebTransport session: routes datagrams to its streams by stream id, sends their acks. */
export class WTSession {
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
export class WTRequest {
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
    await writer.write(encodeUtf8(head + "\n"));
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
      line = JSON.parse(decodeUtf8Strict(pending.subarray(0, newline)));
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
