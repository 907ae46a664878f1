/*
 * The error classes of the whole client, one leaf module (imports nothing). Mirrors core/errors.py (EloquentError,
 * ProtocolError and its DecodeError / LimitExceeded / ProtocolViolation, ConfigError, InvalidArgument), with the
 * few that live elsewhere in Python: CodecError (core/codecs/base.py), BadEventId (core/protocol.py) and the
 * client's (client/eloquent_client/errors.py). Separate so that every other module can raise them without
 * importing the code that defines the others; `SessionLost` is internal (the entry does not re-export it).
 */

export class EloquentError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = new.target.name;
  }
}
/** The peer broke the wire protocol; `code` (the class's CODE) is what a transport reports when it closes. */
export class ProtocolError extends EloquentError {
  static CODE = 0x1;
  constructor(message, options) {
    super(message, options);
    this.code = new.target.CODE;
  }
}
export class DecodeError extends ProtocolError {
  static CODE = 0x2;
}
export class LimitExceeded extends ProtocolError {
  static CODE = 0x3;
}
export class ProtocolViolation extends ProtocolError {
  static CODE = 0x4;
}
export class ConfigError extends EloquentError {}
export class InvalidArgument extends EloquentError {}
export class CodecError extends EloquentError {}
export class BadEventId extends EloquentError {}
/** The request could not be completed; every client error derives from it. */
export class ClientError extends EloquentError {}
/** The server answered with a status other than 200: `status`, and `body` (decoded JSON, else text). */
export class HTTPStatusError extends ClientError {
  constructor(status, body, message) {
    super(message ?? `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}
/** The stream ended before its final event, or its digest did not match the trailer. */
export class IncompleteStream extends ClientError {}
/** The server reported an error inside the stream (an in-band error event). */
export class StreamFailed extends ClientError {
  constructor(message, payload) {
    super(message);
    this.payload = payload;
  }
}

/** Marks a WebTransport delivery that broke mid-stream (the stream goes on over SSE). */
export class SessionLost extends ClientError {}
