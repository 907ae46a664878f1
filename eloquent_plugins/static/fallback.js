/*
 * Why a stream went over SSE instead of WebTransport datagrams: one reason code and a sentence for each fallback,
 * so the page, the response (`eloquent-fallback` header, `response.eloquent.fallback`) and the console can say it.
 * A leaf module (imports nothing): webtransport.js, eloquent_client.js and fetch.js use it. docs/BROWSER.md lists
 * when each happens.
 */

/** The reason codes, as sent in the `eloquent-fallback` response header. */
export const FallbackReason = Object.freeze({
  /** The page is not a secure context (an http:// page other than localhost): browsers hide WebTransport. */
  INSECURE_CONTEXT: "insecure-context",
  /** This browser (or runtime) has no WebTransport. */
  NO_WEBTRANSPORT: "no-webtransport",
  /** The session did not open within `webTransportTimeout` (UDP blocked, or the handshake's packets lost). */
  OPEN_TIMEOUT: "open-timeout",
  /** The browser refused the server's certificate (not trusted, or not the hash it was given). */
  CERTIFICATE_REFUSED: "certificate-refused",
  /** The handshake failed without saying why (Chromium reports a refused certificate this way too). */
  HANDSHAKE_FAILED: "handshake-failed",
  /** The session opened but the request on it failed before its status line. */
  SESSION_FAILED: "session-failed",
  /** An earlier failure for this origin is remembered: WebTransport is not tried again until it expires. */
  REMEMBERED: "remembered",
});

export const FALLBACK_HEADER = "eloquent-fallback";

const MESSAGES = {
  [FallbackReason.INSECURE_CONTEXT]: "the page is not a secure context (WebTransport needs https:// or localhost)",
  [FallbackReason.NO_WEBTRANSPORT]: "this browser has no WebTransport",
  [FallbackReason.OPEN_TIMEOUT]: "the WebTransport session did not open in time (UDP blocked or lossy)",
  [FallbackReason.CERTIFICATE_REFUSED]: "the browser refused the server's certificate for WebTransport",
  [FallbackReason.HANDSHAKE_FAILED]: "the WebTransport handshake failed (often the certificate: untrusted, or not the published hash)",
  [FallbackReason.SESSION_FAILED]: "the WebTransport session failed before the response began",
  [FallbackReason.REMEMBERED]: "WebTransport failed recently for this origin",
};

/** `{reason, message, detail}`: `detail` is what the browser said, when it said anything. */
export function fallback(reason, detail = null) {
  const base = MESSAGES[reason] ?? reason;
  return Object.freeze({ reason, message: detail ? `${base}: ${detail}` : base, detail });
}

/** Why WebTransport cannot even be tried here, or null. `WT`: the constructor the client would use. */
export function unavailable(WT) {
  if (globalThis.isSecureContext === false) return fallback(FallbackReason.INSECURE_CONTEXT);
  if (typeof WT !== "function") return fallback(FallbackReason.NO_WEBTRANSPORT);
  return null;
}

const CERTIFICATE = /certificate|cert_|SEC_ERROR|SSL_ERROR|MOZILLA_PKIX|trust/i;

/** The reason for an error from opening a session (`timedOut`: our own timer fired first). */
export function openFailure(err, { timedOut = false } = {}) {
  const detail = err ? String(err.message || err.name || err) : null;
  if (timedOut) return fallback(FallbackReason.OPEN_TIMEOUT, detail);
  if (detail && CERTIFICATE.test(detail)) return fallback(FallbackReason.CERTIFICATE_REFUSED, detail);
  return fallback(FallbackReason.HANDSHAKE_FAILED, detail);
}
