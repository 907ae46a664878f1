/*
 * Mirrors client/eloquent_client/sse.py: plain SSE over fetch with Last-Event-ID resume, each event exactly once
 * across cuts. Separate because it is a whole path on its own: a stream starts on it, or moves to it when a
 * WebTransport session breaks (response.js).
 */

import { nowSeconds, clientEvent } from "./client_events.js";
import { ClientError, EloquentError, HTTPStatusError, IncompleteStream } from "./errors.js";
import { headerObject, isAbort, parseBody, sleep } from "./http.js";
import { STREAM_HEADER, resumePoint } from "./protocol.js";
import { SSEParser } from "./sse_reader.js";

/** Plain SSE over fetch with Last-Event-ID resume (eloquent_client.sse.stream_sse): each event exactly once. */
export class SSESource {
  constructor(client, request, { token = null, lastId = null } = {}) {
    this.client = client;
    this.request = request;
    this.token = token;
    this.lastId = lastId;
    this.lastPoint = resumePoint(lastId);
    this.failures = 0;
    this.count = 0;
    this.response = null; // a response whose body is still to read
    this.headers = {};
    this.status = null;
    this.requests = 0;
  }

  /** One request; null for a 204 (nothing to stream). */
  async connect() {
    const { method, url, body, headers, signal } = this.request;
    const sent = { accept: "text/event-stream", "cache-control": "no-store", ...headers };
    if (this.lastId !== null) sent["last-event-id"] = this.lastId;
    else if (this.token !== null) sent["last-event-id"] = this.token; // nothing received yet: from the start
    const resuming = "last-event-id" in sent;
    this.requests += 1;
    const response = await this.client.fetch(url, { method, headers: sent, body, signal });
    this.client.noteAltSvc(response.headers);
    if (this.status === null) {
      this.status = response.status;
      this.headers = headerObject(response.headers);
    }
    if (response.status === 204) return null;
    if (response.status !== 200) {
      const detail = parseBody(new Uint8Array(await response.arrayBuffer()));
      const what = resuming ? "resume" : "stream";
      throw new HTTPStatusError(response.status, detail,
        `${what} failed with HTTP ${response.status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
    }
    this.token = response.headers.get(STREAM_HEADER) ?? this.token;
    return response;
  }

  /** Connect (retrying while it may) so that `client.stream()` raises HTTPStatusError at once. */
  async open() {
    for (;;) {
      try {
        this.response = await this.connect();
        this.opened = true;
        return this;
      } catch (err) {
        await this.retryOrThrow(err);
      }
    }
  }

  /** A transport error: wait and let the caller reconnect, or throw when resuming is not possible. */
  async retryOrThrow(err) {
    if (err instanceof EloquentError || isAbort(err, this.request.signal)) throw err;
    const opts = this.client.options;
    const canResume = opts.resume && (this.lastId !== null || this.token !== null);
    if (!canResume || this.failures >= opts.maxRetries) {
      if (this.lastId !== null || this.count) {
        throw new IncompleteStream(`the stream was cut after event ${this.lastId} and could not be resumed: ${err && err.message}`, { cause: err });
      }
      throw new ClientError(`${this.request.method} ${this.request.url} failed: ${err && err.message}`, { cause: err });
    }
    this.failures += 1;
    await sleep(opts.backoff * 2 ** (this.failures - 1));
  }

  /** Close a response nobody read. */
  cancel() {
    const response = this.response;
    this.response = null;
    this.opened = false;
    if (response && response.body && !response.bodyUsed) response.body.cancel().catch(() => {});
  }

  async *events() {
    let response = this.opened ? this.response : undefined;
    this.opened = false;
    this.response = null;
    for (;;) {
      let reader = null;
      try {
        if (response === undefined) response = await this.connect();
        if (response === null) return;
        reader = response.body.getReader();
        response = undefined;
        const parser = new SSEParser();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) {
            reader = null;
            return;
          }
          const now = nowSeconds();
          for (const message of parser.feed(value)) {
            const point = resumePoint(message.id);
            const last = this.lastPoint;
            if (point && last && point.token === last.token && point.after <= last.after) continue; // a repeat
            if (message.id !== null) {
              this.lastId = message.id;
              this.lastPoint = point;
            }
            this.failures = 0;
            const index = point ? point.after : this.count;
            this.count += 1;
            yield clientEvent(index, message.data, now, { event: message.event, id: message.id });
            if (message.data === "[DONE]") return;
          }
        }
      } catch (err) {
        if (reader) reader.cancel().catch(() => {});
        reader = null;
        response = undefined;
        await this.retryOrThrow(err);
      } finally {
        if (reader) reader.cancel().catch(() => {}); // the reader stopped early: close the response
      }
    }
  }
}
