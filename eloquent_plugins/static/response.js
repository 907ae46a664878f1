/*
 * Mirrors client/eloquent_client/response.py: the streaming response a caller reads (events, text deltas, text),
 * on WebTransport or SSE, and the move to SSE after the last rendered event when a session breaks mid-stream.
 * Separate because it joins the two paths and is the object users hold.
 */

import { ClientError, IncompleteStream, SessionLost, StreamFailed } from "./errors.js";
import { formatEventId } from "./protocol.js";
import { SSESource } from "./sse.js";

/** A streaming response: iterate `events()` or `textDeltas()` once; `delivery` says how events came. */
export class EloquentStream {
  constructor(client, request, { sse = null, wt = null }) {
    this.client = client;
    this.request = request;
    this.sse = sse;
    this.wt = wt;
    /** "webtransport" or "sse"; "sse" after a WebTransport session broke mid-stream (then `fellBack`). */
    this.delivery = wt ? "webtransport" : "sse";
    this.status = wt ? wt.status : sse.status;
    this.headers = wt ? wt.headers : sse.headers;
    this.token = wt ? wt.token : sse.token;
    this.rendered = [];
    this.fellBack = false;
    this.consumed = false;
    /** Why this stream is not on WebTransport: null, or {reason, message, detail} (fallback.js). */
    this.fallback = null;
  }

  /** Index of the last event rendered, null before the first. */
  get lastIndex() {
    return this.rendered.length ? this.rendered[this.rendered.length - 1].index : null;
  }

  async *source() {
    if (!this.wt) {
      yield* this.sse.events();
      return;
    }
    let lost;
    try {
      yield* this.wt.events();
      return;
    } catch (err) {
      if (!(err instanceof SessionLost) || !this.client.options.sseFallback) throw err;
      lost = err;
    }
    // The session broke mid-stream: the same stream goes on over SSE after the last rendered event.
    const last = this.lastIndex;
    if (this.token === null && last !== null) {
      throw new IncompleteStream("the WebTransport session broke mid-stream and the server gave no resume token", { cause: lost });
    }
    this.fellBack = true;
    this.delivery = "sse";
    const lastId = this.token !== null && last !== null ? formatEventId(this.token, last) : null;
    this.sse = new SSESource(this.client, this.client.sseRequest(this.request), { token: this.token, lastId });
    await this.sse.open();
    yield* this.sse.events();
  }

  /** Each event once, as it becomes renderable: {index, data, kind, event, id, renderedAt, text, error, json}. */
  async *events() {
    if (this.consumed) throw new ClientError("the events of a response can be read only once");
    this.consumed = true;
    try {
      for await (const event of this.source()) {
        this.rendered.push(event);
        yield event;
      }
    } finally {
      this.cancel();
    }
  }

  /** The text of OpenAI/TGI/Triton events as it renders; an in-band error raises StreamFailed. */
  async *textDeltas() {
    for await (const event of this.events()) {
      if (event.kind === "error" || event.error !== null) {
        throw new StreamFailed(`the server reported an error: ${event.data}`, event.error ?? event.data);
      }
      const text = event.text;
      if (text) yield text;
    }
  }

  async text() {
    let out = "";
    for await (const t of this.textDeltas()) out += t;
    return out;
  }

  /** Abandon the stream: the WebTransport request is dropped, an SSE response closed. */
  cancel() {
    if (this.wt) this.wt.cancel();
    if (this.sse) this.sse.cancel();
  }
}
