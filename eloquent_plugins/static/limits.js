/*
 * Mirrors core/limits.py: the ceilings a decoder holds a peer to (datagram size, event size, entries per packet,
 * index gap, buffered bytes, streams, stream ids), camelCase. Separate because the wire decoder, the receiver and
 * the client each take them, and none of them owns them.
 */

import { ConfigError } from "./errors.js";

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
