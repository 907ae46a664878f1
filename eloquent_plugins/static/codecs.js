/*
 * Mirrors core/codecs/ (openai.py, tgi.py, triton.py, router.py's sniffing): an engine's event payload read as
 * text, token ids, finish reason, usage or an in-band error. One module for the package: the three codecs are
 * small and share their helpers. Separate because only the client's `text`/`textDeltas` and pages need it.
 */

import { decodeUtf8, decodeUtf8Strict, isObject } from "./bytes.js";
import { CodecError } from "./errors.js";

/** Python's str() for the JSON values an engine puts in an error field. */
function pyStr(v) {
  if (typeof v === "string") return v;
  if (v === null || v === undefined) return "None";
  if (v === true) return "True";
  if (v === false) return "False";
  return typeof v === "number" ? String(v) : JSON.stringify(v);
}
function view(fields = {}) {
  return { text: "", tokenIds: [], finishReason: null, usage: null, error: null, errorType: null, terminal: false,
    ...fields };
}
function loadJson(payload) {
  try {
    return JSON.parse(typeof payload === "string" ? payload : decodeUtf8Strict(payload));
  } catch (err) {
    throw new CodecError(`event payload is not JSON: ${err.message}`);
  }
}
/** Python's truthiness of a JSON value (`x or default`). */
function pyTruthy(v) {
  if (Array.isArray(v)) return v.length > 0;
  if (isObject(v)) return Object.keys(v).length > 0;
  return Boolean(v);
}

/** OpenAI chat/completions chunks (vLLM, TGI's chat route, the built-in engine). */
export const OpenAICodec = {
  name: "openai",
  parse(payload) {
    const text = typeof payload === "string" ? payload : decodeUtf8(payload);
    const stripped = text.replace(/^[ \t\n\r\x0b\x0c]+|[ \t\n\r\x0b\x0c]+$/g, "");
    if (stripped === "[DONE]") return view({ terminal: true });
    return this.read(loadJson(payload));
  },
  read(obj) {
    if (!isObject(obj)) throw new CodecError("OpenAI chunk must be a JSON object");
    const error = obj.error;
    if (error !== undefined && error !== null) {
      if (isObject(error)) return view({ error: pyStr(error.message ?? ""), errorType: pyStr(error.type ?? "") });
      return view({ error: pyStr(error) });
    }
    const text = [];
    const tokenIds = [];
    let finish = null;
    const choices = pyTruthy(obj.choices) ? obj.choices : [];
    if (!Array.isArray(choices)) throw new CodecError("'choices' must be a list");
    for (const choice of choices) {
      if (!isObject(choice)) throw new CodecError("each choice must be an object");
      const delta = choice.delta;
      const piece = isObject(delta) ? delta.content : choice.text;
      if (typeof piece === "string") text.push(piece);
      const ids = choice.token_ids;
      if (Array.isArray(ids)) for (const i of ids) if (Number.isInteger(i) || typeof i === "boolean") tokenIds.push(Number(i));
      if (choice.finish_reason !== undefined && choice.finish_reason !== null) finish = pyStr(choice.finish_reason);
    }
    return view({ text: text.join(""), tokenIds, finishReason: finish, usage: isObject(obj.usage) ? obj.usage : null });
  },
};

/** Text Generation Inference /generate_stream events. */
export const TGICodec = {
  name: "tgi",
  parse(payload) {
    return this.read(loadJson(payload));
  },
  read(obj) {
    if (!isObject(obj)) throw new CodecError("TGI event must be a JSON object");
    if (Object.hasOwn(obj, "error")) return view({ error: pyStr(obj.error), errorType: pyStr(pyTruthy(obj.error_type) ? obj.error_type : "") });
    const token = obj.token;
    if (!isObject(token)) throw new CodecError("TGI event has no 'token' object");
    const text = Object.hasOwn(token, "text") ? token.text : "";
    const details = obj.details;
    const finish = isObject(details) ? details.finish_reason ?? null : null;
    const usage = isObject(details) && Object.hasOwn(details, "generated_tokens")
      ? { completion_tokens: details.generated_tokens } : null;
    return view({ text: pyTruthy(token.special) ? "" : pyStr(text),
      tokenIds: Number.isInteger(token.id) || typeof token.id === "boolean" ? [Number(token.id)] : [],
      finishReason: finish !== null ? pyStr(finish) : null, usage });
  },
};

export const TEXT_OUTPUTS = ["text_output", "OUTPUT", "output", "text"];

/** Triton generate_stream events. */
export const TritonCodec = {
  name: "triton",
  parse(payload) {
    return this.read(loadJson(payload));
  },
  read(obj) {
    if (!isObject(obj)) throw new CodecError("Triton event must be a JSON object");
    if (Object.hasOwn(obj, "error")) return view({ error: pyStr(obj.error) });
    for (const key of TEXT_OUTPUTS) {
      const value = obj[key];
      if (typeof value === "string") return view({ text: value });
      if (Array.isArray(value) && value.every((v) => typeof v === "string")) return view({ text: value.join("") });
    }
    return view();
  },
};

export const CODECS = Object.freeze({ openai: OpenAICodec, tgi: TGICodec, triton: TritonCodec });

/** The codec whose format a decoded event has (core.codecs.sniff_codec). */
export function sniffCodec(obj) {
  if (!isObject(obj)) return null;
  if (Object.hasOwn(obj, "choices")) return OpenAICodec;
  if (Object.hasOwn(obj, "token")) return TGICodec;
  if (Object.hasOwn(obj, "model_name") || TEXT_OUTPUTS.some((k) => Object.hasOwn(obj, k))) return TritonCodec;
  return null;
}

/** The text an event's data adds (OpenAI, TGI or Triton), or null (role chunks, [DONE], errors, other JSON). */
export function textDelta(data) {
  if (!data || data[0] !== "{") return null;
  let obj;
  try {
    obj = JSON.parse(data);
  } catch {
    return null;
  }
  const codec = sniffCodec(obj);
  if (codec === null) return null;
  try {
    return codec.read(obj).text || null;
  } catch (err) {
    if (err instanceof CodecError) return null;
    throw err;
  }
}
