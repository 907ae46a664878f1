/*
 * `eloquentFetch`: a drop-in `fetch` for SDKs that take one (the openai npm SDK's `fetch` option, the Vercel AI
 * SDK's `createOpenAI({ fetch })`). A streaming request (a JSON body with `"stream": true`, or `Accept:
 * text/event-stream`) goes through an `EloquentClient` for its origin: WebTransport datagrams where it can, SSE
 * with Last-Event-ID resume where it cannot (or when the session breaks mid-stream). Its `Response` body is the
 * SSE bytes the plain path gives (`id:` + `data:` per event), so the SDK's own parser reads it unchanged. Every
 * other request is plain `fetch`.
 *
 * Each response carries `eloquent-delivery: datagram | h3-stream | sse` (as the Python httpx transports) and, when a
 * stream could not use WebTransport, `eloquent-fallback: <reason>` (fallback.js); `response.eloquent` has the
 * same live: `{delivery, fallback, fellBack, headers, stream}`. Each fallback is also logged (`log` option).
 *
 * Imports the modules it needs, not the entry (client.js re-exports both this module and eloquent.js).
 */
import { EloquentClient } from "./eloquent_client.js";
import { HTTPStatusError } from "./errors.js";
import { FALLBACK_HEADER } from "./fallback.js";
import { TRANSPORT_HEADER, formatEventId } from "./protocol.js";

export const DELIVERY_HEADER = "eloquent-delivery";

const DROP_REQUEST = new Set(["host", "content-length", "connection", "transfer-encoding", "accept-encoding",
  "keep-alive", "upgrade"]);
const DROP_RESPONSE = new Set(["content-length", "content-encoding", "transfer-encoding", "connection"]);

/** Is this request a stream (the Python transports' rule: `stream: true` in a JSON POST, or Accept: SSE)? */
export function isStreaming(method, headers, body) {
  if ((headers.get("accept") || "").includes("text/event-stream")) return true;
  if (method !== "POST" || typeof body !== "string" || !(headers.get("content-type") || "application/json").includes("json")) {
    return false;
  }
  try {
    const payload = JSON.parse(body);
    return payload !== null && typeof payload === "object" && !Array.isArray(payload) && payload.stream === true;
  } catch {
    return false;
  }
}

/** One event as the plain SSE path writes it (eloquent_client.attempts.sse_bytes). */
export function sseBytes(event, token = null) {
  const lines = [];
  const id = event.id ?? (token !== null && event.index !== null && event.index !== undefined
    ? formatEventId(token, event.index) : null);
  if (id !== null) lines.push(`id: ${id}`);
  if (event.event && event.event !== "message") lines.push(`event: ${event.event}`);
  for (const line of event.data.split("\n")) lines.push(`data: ${line}`);
  return new TextEncoder().encode(lines.join("\n") + "\n\n");
}

function abortError(signal) {
  const reason = signal?.reason;
  if (reason instanceof Error) return reason;
  return new DOMException("The operation was aborted.", "AbortError");
}

/** A request's parts, from fetch's (input, init): a string body (SDKs send JSON text) or the raw one. */
async function requestParts(input, init) {
  const isRequest = typeof Request !== "undefined" && input instanceof Request;
  const base = globalThis.location?.href;
  const url = new URL(isRequest ? input.url : String(input), base);
  const method = (init.method ?? (isRequest ? input.method : "GET")).toUpperCase();
  const headers = new Headers(init.headers ?? (isRequest ? input.headers : undefined));
  let body = init.body ?? null;
  if (body === null && isRequest && input.body !== null) body = await input.clone().text();
  if (body instanceof Uint8Array || body instanceof ArrayBuffer) body = new TextDecoder().decode(body);
  return { url, method, headers, body, signal: init.signal ?? (isRequest ? input.signal : undefined) };
}

/** The response of a stream: its events as SSE bytes, read as the caller pulls. */
function streamResponse(stream, signal) {
  const iterator = stream.events();
  const token = stream.token ?? null;
  let onAbort = null;
  const body = new ReadableStream({
    start(controller) {
      if (!signal) return;
      onAbort = () => {
        stream.cancel();
        try { controller.error(abortError(signal)); } catch { /* already closed */ }
      };
      signal.addEventListener("abort", onAbort, { once: true });
    },
    async pull(controller) {
      try {
        const { value, done } = await iterator.next();
        if (signal?.aborted) return;
        if (done) {
          signal?.removeEventListener("abort", onAbort);
          controller.close();
        } else controller.enqueue(sseBytes(value, token));
      } catch (err) {
        signal?.removeEventListener("abort", onAbort);
        controller.error(err);
      }
    },
    async cancel() {
      signal?.removeEventListener("abort", onAbort);
      await iterator.return?.();
      stream.cancel();
    },
  }, { highWaterMark: 0 }); // pull one event at a time, as the caller reads: no buffering beyond the client's
  const delivery = stream.wt ? (stream.wt.assembler ? "datagram" : "h3-stream") : "sse";
  const headers = new Headers();
  for (const [key, value] of Object.entries(stream.headers || {})) {
    if (!DROP_RESPONSE.has(key) && key !== TRANSPORT_HEADER) headers.set(key, value);
  }
  headers.set("content-type", "text/event-stream; charset=utf-8"); // the datagram framing is undone here
  headers.set(DELIVERY_HEADER, delivery);
  if (stream.fallback) headers.set(FALLBACK_HEADER, stream.fallback.reason);
  const response = new Response(body, { status: stream.status ?? 200, headers });
  Object.defineProperty(response, "eloquent", { value: Object.freeze({
    stream,
    /** The server's own response headers (incl. eloquent-transport on the datagram path). */
    headers: { ...(stream.headers || {}) },
    fallback: stream.fallback,
    get delivery() { return stream.fellBack ? "sse" : delivery; },
    get fellBack() { return stream.fellBack; },
  }) });
  return response;
}

/** The server's non-200 answer as the response plain fetch would give (the SDK raises its own error). */
function statusResponse(err, delivery) {
  const text = typeof err.body === "string" ? err.body : JSON.stringify(err.body);
  const headers = new Headers({ "content-type": typeof err.body === "string" ? "text/plain; charset=utf-8" : "application/json",
    [DELIVERY_HEADER]: delivery });
  return new Response(text, { status: err.status, headers });
}

/** A plain fetch's response with `eloquent-delivery: sse` added (fetched headers are immutable: copied). */
function plainResponse(response) {
  if (response.type === "opaque" || response.type === "opaqueredirect" || response.status < 200) return response;
  const headers = new Headers(response.headers);
  headers.set(DELIVERY_HEADER, "sse");
  const out = new Response([101, 204, 205, 304].includes(response.status) ? null : response.body,
    { status: response.status, statusText: response.statusText, headers });
  Object.defineProperty(out, "eloquent", { value: Object.freeze({ delivery: "sse", fallback: null, fellBack: false,
    headers: Object.fromEntries(response.headers), stream: null }) });
  return out;
}

function defaultLog(url, fallback) {
  console.warn(`eloquentFetch: ${url} streams over SSE (${fallback.reason}): ${fallback.message}`);
}

/**
 * `createEloquentFetch(options)`: a `fetch` with EloquentClient's options (transport, webTransportPort,
 * webTransportTimeout, certificateHash, sessionPath, resume, maxRetries, ...; `fetch`: the plain fetch underneath)
 * plus `log(url, fallback)` (default console.warn; null: silent). One client per origin, its session reused.
 */
export function createEloquentFetch(options = {}) {
  const { log = defaultLog, ...clientOptions } = options;
  const clients = new Map();
  const plain = (url, init) => (clientOptions.fetch ?? globalThis.fetch)(url, init);
  const clientFor = (origin) => {
    let client = clients.get(origin);
    if (!client) clients.set(origin, client = new EloquentClient(origin, clientOptions));
    return client;
  };

  async function eloquentFetch(input, init = {}) {
    const request = await requestParts(input, init);
    const { url, method, headers, body, signal } = request;
    if (signal?.aborted) throw abortError(signal);
    if ((url.protocol !== "http:" && url.protocol !== "https:") || !isStreaming(method, headers, body)) {
      return plainResponse(await plain(input, init));
    }
    const client = clientFor(url.origin);
    const sent = {};
    headers.forEach((value, key) => { if (!DROP_REQUEST.has(key)) sent[key] = value; });
    let stream;
    try {
      stream = await client.stream(url.pathname + url.search, body, { headers: sent, method, signal });
    } catch (err) {
      if (signal?.aborted) throw abortError(signal);
      if (err instanceof HTTPStatusError) return statusResponse(err, client.session && !client.session.lost ? "h3-stream" : "sse");
      throw new TypeError(`eloquentFetch: ${method} ${url.href} failed: ${err && err.message}`, { cause: err });
    }
    if (stream.fallback && log) log(url.href, stream.fallback);
    return streamResponse(stream, signal);
  }

  eloquentFetch.close = () => {
    for (const client of clients.values()) client.close();
    clients.clear();
  };
  return eloquentFetch;
}

let shared = null;
/** `fetch` with the default options (Alt-Svc names the HTTP/3 port; the certificate hash from the same origin). */
export function eloquentFetch(input, init) {
  shared ??= createEloquentFetch();
  return shared(input, init);
}
