// protocol.js against core/protocol.py: the event ids of tests/vectors/event_ids.json (tests/support/make_vectors.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import { parseEventId } from "../../eloquent_plugins/static/protocol.js";
import { vectors } from "./helpers.mjs";

test("event ids", () => {
  for (const c of vectors("event_ids")) {
    let got;
    try {
      const p = parseEventId(c.value);
      got = { value: c.value, token: p.token, after: p.after };
    } catch (err) {
      got = { value: c.value, error: err.name };
    }
    assert.deepEqual(got, c);
  }
});
