// sha256.js (the stream digest's hash; Python uses hashlib) against node:crypto, fed in two pieces.
import { createHash } from "node:crypto";
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Sha256 } from "../../eloquent_plugins/static/sha256.js";

describe("control records", () => {
  test("sha-256 agrees with node:crypto", () => {
    for (const n of [0, 1, 55, 56, 63, 64, 65, 119, 120, 127, 128, 1000, 1 << 20]) {
      const data = new Uint8Array(n).map((_, i) => (i * 31 + 7) & 0xff);
      const h = new Sha256();
      h.update(data.subarray(0, n >> 1));
      h.update(data.subarray(n >> 1));
      assert.equal(h.hexdigest(), createHash("sha256").update(data).digest("hex"), `length ${n}`);
    }
  });
});
