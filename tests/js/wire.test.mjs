// wire.js against core/wire.py: the packets of tests/vectors/packets.json (tests/support/make_vectors.py).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { fromHex, toHex } from "../../eloquent_plugins/static/bytes.js";
import { ProtocolError } from "../../eloquent_plugins/static/errors.js";
import { DEFAULT_LIMITS, makeLimits } from "../../eloquent_plugins/static/limits.js";
import { decodePacket, encodePacket } from "../../eloquent_plugins/static/wire.js";
import { vectors } from "./helpers.mjs";

function packetJson(p) {
  if (p.type !== "data") return p;
  return { ...p, entries: p.entries.map((e) => ({ ...e, middle: toHex(e.middle) })) };
}
function packetFromJson(p) {
  if (p.type !== "data") return p;
  return { ...p, entries: p.entries.map((e) => ({ ...e, middle: fromHex(e.middle) })) };
}

describe("packets", () => {
  const v = vectors("packets");
  test("valid packets decode and re-encode identically", () => {
    for (const { hex, packet } of v.valid) {
      assert.deepEqual(packetJson(decodePacket(fromHex(hex))), packet);
      assert.equal(toHex(encodePacket(packetFromJson(packet))), hex);
    }
  });
  test("odd packets: the same outcome, the same error class", () => {
    for (const c of v.odd) {
      const limits = c.limits ? makeLimits(c.limits) : DEFAULT_LIMITS;
      let got;
      try {
        got = { packet: packetJson(decodePacket(fromHex(c.hex), limits)) };
      } catch (err) {
        assert.ok(err instanceof ProtocolError, `${c.hex}: ${err}`);
        got = { error: err.name };
      }
      assert.deepEqual(got, c.error ? { error: c.error } : { packet: c.packet }, c.hex);
    }
  });
  test("padded packets (zero bytes after the last field) decode as the packet without them", () => {
    assert.ok(v.padded.length > 0);
    for (const { hex, size, packet } of v.padded) {
      assert.equal(hex.length / 2, size);
      assert.deepEqual(packetJson(decodePacket(fromHex(hex))), packet);
    }
  });
});
