/*
 * Mirrors client/eloquent_client/client.py (named so because client.js is the page's entry module):
 * `EloquentClient`, which picks the path for each request (WebTransport where it opens, SSE otherwise), opens and
 * reuses the session, and remembers the origins where WebTransport failed. Separate because it composes the paths.
 */

import { asBytes, base64Decode, isObject } from "./bytes.js";
import { ConfigError, HTTPStatusError } from "./errors.js";
import { FallbackReason, fallback, unavailable } from "./fallback.js";
import { headerObject, isAbort } from "./http.js";
import { DEFAULT_LIMITS, makeLimits } from "./limits.js";
import { EloquentStream } from "./response.js";
import { SSESource } from "./sse.js";
import { WTRequest, WTSession } from "./webtransport.js";

// origin -> {until (ms), fallback, failures}: WebTransport is not tried again before `until`; each failure in a row
// doubles the wait (retryAfter, 2x, ... up to rememberFailure), a session that opens forgets them.
const FAILED_ORIGINS = new Map();
const DEFAULT_OPTIONS = Object.freeze({
  transport: "auto", headers: {}, sessionPath: "/eloquent/wt", certificateHash: "auto",
  webTransportTimeout: 1000, webTransportPort: null, retryAfter: 5000, rememberFailure: 60 * 1000, sseFallback: true,
  resume: true, maxRetries: 8, backoff: 100, limits: null, fetch: null, WebTransport: null,
});

/** Forget WebTransport failures remembered for every origin (tests). */
export function forgetWebTransportFailures() {
  FAILED_ORIGINS.clear();
}

/**
 * `new EloquentClient(origin, {transport: "auto" | "webtransport" | "sse", ...})`; `await client.stream(path,
 * body, {headers})` gives an EloquentStream. Options: headers, sessionPath ("/eloquent/wt"), certificateHash
 * ("auto": GET /eloquent/cert-hash; null: the system's trust; a base64 string or bytes), webTransportTimeout (ms),
 * webTransportPort, retryAfter / rememberFailure (ms: the first and the longest wait before a failed origin is
 * tried again), sseFallback, resume, maxRetries, backoff (ms), limits, fetch,
 * WebTransport (both injectable).
 */
export class EloquentClient {
  constructor(origin, options = {}) {
    let url;
    try {
      url = new URL(origin);
    } catch {
      throw new ConfigError(`origin must be http(s)://host[:port], got ${JSON.stringify(origin)}`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") throw new ConfigError(`origin must be http(s), got ${origin}`);
    this.options = { ...DEFAULT_OPTIONS, ...options };
    if (!["auto", "webtransport", "sse"].includes(this.options.transport)) {
      throw new ConfigError(`transport must be auto, webtransport or sse, got ${JSON.stringify(this.options.transport)}`);
    }
    this.url = url;
    this.origin = url.origin;
    this.baseUrl = url.origin + url.pathname.replace(/\/+$/, "");
    this.limits = this.options.limits ? makeLimits(this.options.limits) : DEFAULT_LIMITS;
    this.session = null;
    this.sessionOpening = null;
    this.altSvcPort = null;
  }

  fetch(url, init) {
    const f = this.options.fetch ?? globalThis.fetch;
    return f(url, init);
  }

  /** Remember the HTTP/3 port an `Alt-Svc: h3=":PORT"` header names. */
  noteAltSvc(headers) {
    const value = headers && typeof headers.get === "function" ? headers.get("alt-svc") : null;
    if (!value) return;
    const match = /(?:^|,)\s*h3="([^":]*):(\d+)"/.exec(value);
    if (match && (!match[1] || match[1] === this.url.hostname)) this.altSvcPort = Number(match[2]);
  }

  webTransportUrl() {
    const port = this.options.webTransportPort ?? this.altSvcPort ?? (this.url.port || (this.url.protocol === "https:" ? 443 : 80));
    const host = this.url.hostname.includes(":") ? `[${this.url.hostname}]` : this.url.hostname;
    return `https://${host}:${port}${this.url.pathname.replace(/\/+$/, "")}${this.options.sessionPath}`;
  }

  /** serverCertificateHashes for the session, or null (the system's roots). */
  async certificateHashes() {
    const option = this.options.certificateHash;
    if (option === null || option === undefined || option === false) return null;
    const value = (v) => (typeof v === "string" ? base64Decode(v) : asBytes(v));
    if (Array.isArray(option)) return option.map((h) => ({ algorithm: h.algorithm, value: value(h.value) }));
    if (option !== "auto") return [{ algorithm: "sha-256", value: value(option) }];
    const page = globalThis.location?.origin;
    if (page !== undefined && page !== this.origin) return null; // only a same-origin page asks the server
    try {
      const response = await this.fetch(`${this.baseUrl}/eloquent/cert-hash`, { headers: { accept: "application/json" } });
      this.noteAltSvc(response.headers);
      if (response.status !== 200) return null;
      const body = await response.json();
      if (!isObject(body) || body.algorithm !== "sha-256" || typeof body.value !== "string") return null;
      return [{ algorithm: "sha-256", value: base64Decode(body.value) }];
    } catch {
      return null;
    }
  }

  async openSession() {
    if (this.session && !this.session.lost) return this.session;
    if (!this.sessionOpening) {
      this.sessionOpening = (async () => {
        const hashes = await this.certificateHashes();
        return WTSession.open(this, this.webTransportUrl(), hashes);
      })();
    }
    try {
      this.session = await this.sessionOpening;
      return this.session;
    } finally {
      this.sessionOpening = null;
    }
  }

  webTransportAvailable() {
    return typeof (this.options.WebTransport ?? globalThis.WebTransport) === "function";
  }

  sseRequest(request) {
    return { method: request.method, url: this.baseUrl + request.path, body: request.body, headers: request.headers,
      signal: request.signal };
  }

  /** Start a streaming request; resolves once the response head is in (HTTPStatusError for a non-200). */
  async stream(path, body, { headers = {}, method = "POST", signal } = {}) {
    const merged = { ...headerObject(this.options.headers), ...headerObject(headers) };
    let payload = body;
    if (body !== undefined && body !== null && typeof body === "object" && !(body instanceof Uint8Array)
        && !(body instanceof ArrayBuffer) && !ArrayBuffer.isView(body)) {
      payload = JSON.stringify(body);
      merged["content-type"] ??= "application/json";
    }
    const request = { method, path, body: payload, headers: merged, signal };
    const { transport } = this.options;
    let why = null; // why this stream is not on WebTransport (stays null when the caller asked for SSE)
    if (transport === "auto") {
      const remembered = FAILED_ORIGINS.get(this.origin);
      why = unavailable(this.options.WebTransport ?? globalThis.WebTransport);
      if (!why && remembered !== undefined && remembered.until > Date.now()) {
        why = fallback(FallbackReason.REMEMBERED, remembered.fallback.message);
      }
    }
    if (transport === "webtransport" || (transport === "auto" && !why)) {
      try {
        const session = await this.openSession();
        FAILED_ORIGINS.delete(this.origin);
        const wt = await new WTRequest(session, request).start();
        const stream = new EloquentStream(this, request, { wt });
        signal?.addEventListener("abort", () => stream.cancel(), { once: true });
        return stream;
      } catch (err) {
        if (transport === "webtransport" || err instanceof HTTPStatusError || isAbort(err, signal)) throw err;
        why = err.fallback ?? fallback(FallbackReason.SESSION_FAILED, err && err.message);
        const failures = (FAILED_ORIGINS.get(this.origin)?.failures ?? 0) + 1;
        const { retryAfter, rememberFailure } = this.options;
        const wait = Math.min(rememberFailure, retryAfter * 2 ** (failures - 1));
        FAILED_ORIGINS.set(this.origin, { until: Date.now() + wait, fallback: why, failures });
      }
    }
    const sse = await new SSESource(this, this.sseRequest(request)).open();
    const stream = new EloquentStream(this, request, { sse });
    stream.fallback = why;
    return stream;
  }

  close() {
    if (this.session) this.session.close();
    this.session = null;
  }
}
