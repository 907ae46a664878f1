// varint.js against core/varint.py: the vectors of tests/vectors/varint.json (tests/support/make_vectors.py).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { fromHex, toHex } from "../../eloquent_plugins/static/bytes.js";
import { decodeVarint, decodeVarintBig, encodeVarint } from "../../eloquent_plugins/static/varint.js";
import { thrownName, vectors } from "./helpers.mjs";

describe("varint", () => {
  const v = vectors("varint");
  test("encode and decode like Python", () => {
    for (const { value, hex } of v.values) {
      assert.equal(toHex(encodeVarint(value)), hex, `encode ${value}`);
      assert.deepEqual(decodeVarint(fromHex(hex), 0), [value, hex.length / 2]);
    }
  });
  test("62-bit values as BigInt; above 2^53 a number decode refuses", () => {
    for (const { value, hex } of v.big) {
      assert.equal(toHex(encodeVarint(BigInt(value))), hex);
      assert.deepEqual(decodeVarintBig(fromHex(hex), 0), [BigInt(value), 8]);
      assert.equal(thrownName(() => decodeVarint(fromHex(hex), 0)), "LimitExceeded");
    }
  });
  test("truncated", () => {
    for (const hex of v.truncated) assert.equal(thrownName(() => decodeVarint(fromHex(hex), 0)), "DecodeError");
  });
});
