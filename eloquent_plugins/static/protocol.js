/*
 * Mirrors core/protocol.py: the header names both ends agree on and the SSE event ids (`<token>:<index>`, the
 * Last-Event-ID a resume sends). Separate because the SSE path, the WebTransport path and eloquentFetch all read
 * them, and none of them needs the wire format.
 */

import { BadEventId } from "./errors.js";

export const STREAM_HEADER = "x-eloquent-stream";
export const TRANSPORT_HEADER = "eloquent-transport";
export const DATAGRAM = "datagram";

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
/** The resume point an event id names, or null (not one of ours, or before the first event). */
export function resumePoint(id) {
  if (!id) return null;
  try {
    const point = parseEventId(id);
    return point.after >= 0 ? point : null;
  } catch (err) {
    if (err instanceof BadEventId) return null;
    throw err;
  }
}
