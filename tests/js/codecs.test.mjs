// codecs.js against core/codecs/: the views of tests/vectors/codecs.json (tests/support/make_vectors.py).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { CODECS, textDelta } from "../../eloquent_plugins/static/codecs.js";
import { vectors } from "./helpers.mjs";

describe("codecs", () => {
  const v = vectors("codecs");
  for (const [name, cases] of Object.entries(v.views)) {
    test(name, () => {
      for (const c of cases) {
        let got;
        try {
          got = { payload: c.payload, view: CODECS[name].parse(new TextEncoder().encode(c.payload)) };
        } catch (err) {
          got = { payload: c.payload, error: err.name };
        }
        assert.deepEqual(got, c, c.payload);
      }
    });
  }
  test("textDelta", () => {
    for (const { data, text } of v.textDelta) assert.equal(textDelta(data), text, data);
  });
});
