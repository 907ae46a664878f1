/*
 * Mirrors client/eloquent_client/events.py: what a stream yields, one event object per rendered event whatever the
 * transport, stamped with the render clock. Separate because the SSE path and the WebTransport path both make
 * them, and neither should import the other.
 */

import { isObject } from "./bytes.js";
import { textDelta } from "./codecs.js";

/** The render clock, in seconds (as the Python client's time.monotonic()). */
export const nowSeconds = () => (globalThis.performance ? performance.now() : Date.now()) / 1000;

/** The event a stream yields: {index, data, kind ("data"|"error"), event, id, renderedAt, text, error, json}. */
export function clientEvent(index, data, renderedAt, { kind = "data", event = "message", id = null } = {}) {
  return {
    index, data, kind, event, id, renderedAt,
    get json() {
      try {
        return JSON.parse(this.data);
      } catch {
        return null;
      }
    },
    get text() {
      return textDelta(this.data);
    },
    get error() {
      const obj = this.json;
      return isObject(obj) && Object.hasOwn(obj, "error") ? obj.error : null;
    },
  };
}
