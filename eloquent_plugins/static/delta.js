/*
 * Mirrors core/delta.py: an event as the bytes it shares with a reference event (a common prefix and suffix) and
 * the middle that differs. A leaf module: the receiver applies deltas, the vectors test them alone.
 */

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
