// sse_reader.js against core/sse_reader.py: awkward splits from tests/vectors/sse.json (tests/support/make_vectors.py).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { fromHex, toHex } from "../../eloquent_plugins/static/bytes.js";
import { SSEParser } from "../../eloquent_plugins/static/sse_reader.js";
import { thrownName, vectors } from "./helpers.mjs";

describe("SSE parser", () => {
  const v = vectors("sse");
  for (const c of v.cases) {
    test(c.name, () => {
      const stream = fromHex(c.hex);
      for (const run of c.runs) {
        const parser = new SSEParser();
        const cuts = [0, ...run.splits, stream.length];
        const messages = [];
        for (let i = 0; i + 1 < cuts.length; i++) messages.push(...parser.feed(stream.subarray(cuts[i], cuts[i + 1])));
        const got = messages.map((m) => ({ data: m.data, event: m.event, id: m.id, retry: m.retry, comments: m.comments,
          raw: toHex(m.raw) }));
        assert.deepEqual(got, run.messages, `${c.name} split at ${run.splits}`);
        assert.deepEqual({ lastEventId: parser.lastEventId, retry: parser.retry, commentsSeen: parser.commentsSeen },
          run.state);
      }
    });
  }
  test("a message above the limit", () => {
    const parser = new SSEParser({ maxMessageBytes: v.overflow.maxMessageBytes });
    assert.equal(thrownName(() => parser.feed(fromHex(v.overflow.hex))), v.overflow.error);
  });
});
