/*
 * What the client's HTTP paths share, no Python mirror of its own (client/eloquent_client/bounds.py and
 * attempts.py do these inline): headers as a plain lower-cased object, an error body decoded (JSON, else text),
 * telling an abort from a failure, and the back-off wait. Separate so that sse.js, webtransport.js and
 * eloquent_client.js need not import one another for them.
 */

import { decodeUtf8 } from "./bytes.js";

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export function headerObject(headers) {
  const out = {};
  if (!headers) return out;
  if (typeof headers.forEach === "function" && !Array.isArray(headers)) {
    headers.forEach((value, key) => { out[key.toLowerCase()] = value; });
  } else {
    for (const [key, value] of Array.isArray(headers) ? headers : Object.entries(headers)) out[key.toLowerCase()] = String(value);
  }
  return out;
}

export function parseBody(bytes) {
  const text = decodeUtf8(bytes);
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

export function isAbort(err, signal) {
  return (signal && signal.aborted) || (err && err.name === "AbortError");
}
