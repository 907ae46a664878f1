// The client's ES modules (eloquent_plugins/static/*.js) as a whole: each loads on its own, they import one another
// relatively with explicit `.js` names and never in a circle, each stays small, and the entry (eloquent.js) still
// exports every name it exported as one file, so `import ... from "/eloquent/eloquent.js"` keeps working.
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { describe, test } from "node:test";

const STATIC = new URL("../../eloquent_plugins/static/", import.meta.url);
const MODULES = readdirSync(STATIC).filter((name) => name.endsWith(".js")).sort();
const source = (name) => readFileSync(new URL(name, STATIC), "utf8");

/** What eloquent.js exported when it was one 1,915-line file: the names users and tests import from it. */
const ENTRY_EXPORTS = [
  "BadEventId", "CODECS", "ClientError", "CodecError", "ConfigError", "ControlParser", "DATAGRAM", "DEFAULT_LIMITS",
  "DecodeError", "EloquentAssembler", "EloquentClient", "EloquentError", "EloquentReceiver", "EloquentStream",
  "EventKind", "FALLBACK_HEADER", "FallbackReason", "HTTPStatusError", "IncompleteStream", "InvalidArgument",
  "LimitExceeded", "MAX_VARINT", "OpenAICodec", "PacketType", "ProtocolError", "ProtocolViolation",
  "REFERENCE_SLACK", "SSEParser", "STREAM_HEADER", "Sha256", "StreamDigest", "StreamFailed", "TEXT_OUTPUTS",
  "TGICodec", "TRANSPORT_HEADER", "TritonCodec", "VERSION", "applyDelta", "base64Decode", "base64Encode",
  "concatBytes", "decodePacket", "decodeUtf8", "decodeVarint", "decodeVarintBig", "encodeFallback", "encodePacket",
  "encodeTrailer", "encodeUtf8", "encodeVarint", "forgetWebTransportFailures", "formatEventId", "fromHex",
  "makeDelta", "makeLimits", "parseEventId", "peekStreamId", "sniffCodec", "textDelta", "toHex", "varintSize",
];
/** What fetch.js adds in the page entry (client.js, served at /eloquent/client.js). */
const FETCH_EXPORTS = ["DELIVERY_HEADER", "createEloquentFetch", "eloquentFetch", "isStreaming", "sseBytes"];

/** Every `import`/`export ... from "<spec>"` of a module's text (comments stripped). */
export function importsOf(text) {
  const code = text.replace(/\/\*[\s\S]*?\*\//g, "").replace(/^\s*\/\/.*$/gm, "");
  return [...code.matchAll(/^\s*(?:import|export)\b[^;"']*?\bfrom\s*["']([^"']+)["']|^\s*import\s*["']([^"']+)["']/gm)]
    .map((m) => m[1] ?? m[2]);
}

/** A circle in `graph` (name -> names it imports) as [a, b, ..., a], or null. */
export function findCircle(graph) {
  const state = new Map(); // undefined: not seen, 1: on the path, 2: done
  const path = [];
  const visit = (node) => {
    state.set(node, 1);
    path.push(node);
    for (const next of graph[node] ?? []) {
      if (state.get(next) === 1) return [...path.slice(path.indexOf(next)), next];
      if (state.get(next) === undefined) {
        const found = visit(next);
        if (found) return found;
      }
    }
    path.pop();
    state.set(node, 2);
    return null;
  };
  for (const node of Object.keys(graph).sort()) {
    if (state.get(node) === undefined) {
      const found = visit(node);
      if (found) return found;
    }
  }
  return null;
}

function graphOfStatic() {
  const graph = {};
  for (const name of MODULES) graph[name] = importsOf(source(name)).map((spec) => spec.replace(/^\.\//, ""));
  return graph;
}

describe("the client's modules", () => {
  test("there are modules beside the entry, and each loads on its own", async () => {
    assert.ok(MODULES.length >= 15, MODULES.join(", "));
    for (const name of MODULES) {
      const module = await import(new URL(name, STATIC).href);
      assert.ok(Object.keys(module).length > 0, `${name} exports nothing`);
    }
  });

  test("imports are siblings named with .js, each one there (no bare package, no build step)", () => {
    for (const name of MODULES) {
      for (const spec of importsOf(source(name))) {
        assert.match(spec, /^\.\/[a-z0-9_]+\.js$/, `${name} imports ${spec}`);
        assert.ok(MODULES.includes(spec.slice(2)), `${name} imports ${spec}, which is not in static/`);
      }
    }
  });

  test("no import circle among them", () => {
    const graph = graphOfStatic();
    assert.ok(graph["eloquent.js"].length > 10 && graph["wire.js"].includes("varint.js"), "the import lines were read");
    assert.equal(findCircle(graph), null);
  });

  test("the circle check finds a planted circle", () => {
    assert.deepEqual(findCircle({ "a.js": ["b.js"], "b.js": ["c.js"], "c.js": ["a.js"], "d.js": [] }),
      ["a.js", "b.js", "c.js", "a.js"]);
    const graph = graphOfStatic();
    graph["varint.js"] = [...graph["varint.js"], "receiver.js"]; // receiver -> wire -> varint -> receiver
    assert.ok(findCircle(graph), "a circle through varint.js");
  });

  test("the entry re-exports the same names as the one-file client; client.js adds eloquentFetch", async () => {
    const entry = await import(new URL("eloquent.js", STATIC).href);
    assert.deepEqual(Object.keys(entry).sort(), [...ENTRY_EXPORTS].sort());
    const page = await import(new URL("client.js", STATIC).href);
    assert.deepEqual(Object.keys(page).sort(), [...ENTRY_EXPORTS, ...FETCH_EXPORTS].sort());
    const { EloquentClient } = await import(new URL("eloquent_client.js", STATIC).href);
    assert.equal(entry.EloquentClient, EloquentClient, "one module instance, whichever way it is reached");
  });

  test("each module says what it is in a header comment and stays under 400 lines", () => {
    for (const name of MODULES) {
      const text = source(name);
      assert.match(text, /^(\/\*|\/\/)/, `${name} starts without a header comment`);
      const lines = text.split("\n").length;
      assert.ok(lines <= 400 || /^\/\/ long: /.test(text), `${name}: ${lines} lines`);
    }
  });
});
