/*
 * Mirrors core/assembler.py: the client side of an Eloquent response, datagrams (the receiver) and control records
 * (the trailer, fallback batches) joined into one ordered stream whose digest is checked at the end. Separate
 * because it is what the WebTransport path drives, and the vectors test it without a session.
 */

import { ControlParser, StreamDigest } from "./control.js";
import { IncompleteStream } from "./errors.js";
import { EventKind } from "./events.js";
import { DEFAULT_LIMITS } from "./limits.js";
import { EloquentReceiver } from "./receiver.js";

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
