/*
 * Eloquent client for browsers and node >= 20: plain ES modules, no build step, no dependencies. This is the
 * entry: it re-exports the public API of the modules beside it, so `import ... from "/eloquent/eloquent.js"` (or
 * the page entry /eloquent/client.js, which adds eloquentFetch) gives the whole client.
 *
 * A JavaScript port of the Python reference (eloquent_plugins.core + eloquent_client), byte for byte on the wire,
 * one module per core module: varint.js, wire.js (packets, docs/PROTOCOL.md), delta.js, receiver.js (reassembly,
 * fragments, in-order rendering, acks), control.js (control records, the stream digest), assembler.js,
 * sse_reader.js, codecs.js (OpenAI/TGI/Triton), protocol.js (headers, event ids), limits.js, events.js,
 * errors.js; then the client: eloquent_client.js (`EloquentClient`, which streams over WebTransport datagrams
 * where it can, webtransport.js, and over SSE with Last-Event-ID resume where it cannot, sse.js), response.js
 * (`EloquentStream`). tests/js/ checks each module against vectors the Python core writes (tests/vectors/).
 *
 * Numbers: every varint this side decodes must fit a JS number (below 2^53); larger ones raise LimitExceeded
 * (Python accepts up to 2^62 - 1, which no server of this package sends). Times are seconds (floats), as in Python.
 */

export {
  BadEventId, ClientError, CodecError, ConfigError, DecodeError, EloquentError, HTTPStatusError, IncompleteStream,
  InvalidArgument, LimitExceeded, ProtocolError, ProtocolViolation, StreamFailed,
} from "./errors.js";
export { EventKind } from "./events.js";
export { DATAGRAM, STREAM_HEADER, TRANSPORT_HEADER, formatEventId, parseEventId } from "./protocol.js";
export { DEFAULT_LIMITS, makeLimits } from "./limits.js";
export { base64Decode, base64Encode, concatBytes, decodeUtf8, encodeUtf8, fromHex, toHex } from "./bytes.js";
export { MAX_VARINT, decodeVarint, decodeVarintBig, encodeVarint, varintSize } from "./varint.js";
export { PacketType, VERSION, decodePacket, encodePacket, peekStreamId } from "./wire.js";
export { applyDelta, makeDelta } from "./delta.js";
export { Sha256 } from "./sha256.js";
export { ControlParser, StreamDigest, encodeFallback, encodeTrailer } from "./control.js";
export { EloquentReceiver, REFERENCE_SLACK } from "./receiver.js";
export { EloquentAssembler } from "./assembler.js";
export { SSEParser } from "./sse_reader.js";
export { CODECS, OpenAICodec, TEXT_OUTPUTS, TGICodec, TritonCodec, sniffCodec, textDelta } from "./codecs.js";
export { FALLBACK_HEADER, FallbackReason } from "./fallback.js";
export { EloquentStream } from "./response.js";
export { EloquentClient, forgetWebTransportFailures } from "./eloquent_client.js";
