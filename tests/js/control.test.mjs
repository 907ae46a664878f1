// control.js against core/control.py: digests and records from tests/vectors/control.json
// (tests/support/make_vectors.py).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { fromHex, toHex } from "../../eloquent_plugins/static/bytes.js";
import { ControlParser, StreamDigest, encodeFallback, encodeTrailer } from "../../eloquent_plugins/static/control.js";
import { thrownName, vectors } from "./helpers.mjs";

describe("control records", () => {
  const v = vectors("control");
  test("stream digests", () => {
    for (const d of v.digests) assert.equal(StreamDigest.of(d.payloads.map(fromHex)), d.sha256);
  });
  test("records parse and re-encode identically", () => {
    for (const r of v.records) {
      const bytes = fromHex(r.hex);
      const parser = new ControlParser();
      const records = [...parser.feed(bytes.subarray(0, 5)), ...parser.feed(bytes.subarray(5))];
      assert.equal(records.length, 1);
      const [rec] = records;
      assert.equal(rec.type, r.type);
      const events = rec.type === "trailer" ? [rec.final] : rec.events;
      assert.deepEqual(events.map((e) => ({ index: e.index, kind: e.kind, payload: toHex(e.payload) })), r.events);
      if (rec.type === "trailer") {
        assert.deepEqual([rec.count, rec.sha256], [r.count, r.sha256]);
        assert.equal(toHex(encodeTrailer(rec)), r.hex);
      } else {
        assert.equal(toHex(encodeFallback(rec.events)), r.hex);
      }
    }
  });
  test("bad records raise the same errors", () => {
    for (const { line, error } of v.invalid) {
      assert.equal(thrownName(() => new ControlParser().feed(new TextEncoder().encode(line + "\n"))), error, line);
    }
  });
  test("a record cut by the end of the stream", () => {
    const parser = new ControlParser();
    parser.feed(new TextEncoder().encode('{"type":"fall'));
    assert.equal(thrownName(() => parser.close()), "DecodeError");
  });
});
