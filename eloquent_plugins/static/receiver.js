/*
 * Mirrors core/receiver.py: one stream's receiving half (reassembly, fragments, deltas against earlier events,
 * in-order rendering, each event once, cumulative acks). Separate because it is the datagram path's state
 * machine on its own: the assembler wraps it, the vectors replay scripted loss against it.
 */

import { applyDelta } from "./delta.js";
import { LimitExceeded, ProtocolViolation } from "./errors.js";
import { EventKind } from "./events.js";
import { DEFAULT_LIMITS } from "./limits.js";
import { decodePacket, encodePacket } from "./wire.js";

export const REFERENCE_SLACK = 256;

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
