// delta.js against core/delta.py: the deltas of tests/vectors/packets.json (tests/support/make_vectors.py).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { fromHex, toHex } from "../../eloquent_plugins/static/bytes.js";
import { applyDelta, makeDelta } from "../../eloquent_plugins/static/delta.js";
import { vectors } from "./helpers.mjs";

describe("packets", () => {
  test("deltas", () => {
    for (const d of vectors("packets").deltas) {
      const [prefix, suffix, middle] = makeDelta(fromHex(d.ref), fromHex(d.payload));
      assert.deepEqual([prefix, suffix, toHex(middle)], [d.prefix, d.suffix, d.middle]);
      assert.equal(toHex(applyDelta(fromHex(d.ref), prefix, suffix, middle)), d.payload);
    }
  });
});
