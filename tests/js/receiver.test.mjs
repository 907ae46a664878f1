// receiver.js against core/receiver.py: scripted loss from tests/vectors/receiver.json, the same renders and the
// same ack bytes (tests/support/make_vectors.py).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { fromHex, toHex } from "../../eloquent_plugins/static/bytes.js";
import { makeLimits } from "../../eloquent_plugins/static/limits.js";
import { EloquentReceiver } from "../../eloquent_plugins/static/receiver.js";
import { vectors } from "./helpers.mjs";

describe("receiver under scripted loss", () => {
  for (const run of vectors("receiver").runs) {
    test(run.name, () => {
      const receiver = new EloquentReceiver(run.streamId, { limits: makeLimits(run.limits), ackDelay: run.ackDelay });
      const rendered = [];
      for (const [i, step] of run.trace.entries()) {
        const where = `${run.name} step ${i}`;
        if (step.op === "datagram") {
          const events = receiver.receiveDatagram(fromHex(step.hex), step.t);
          assert.deepEqual(events.map((e) => e.index), step.rendered, where);
          for (const e of events) {
            assert.equal(toHex(e.payload), run.events[e.index], where);
            rendered.push(e);
          }
        }
        assert.deepEqual(receiver.datagramsToSend(step.t).map(toHex), step.acks, `${where}: acks`);
        if (step.op === "datagram") assert.equal(receiver.nextDeadline(), step.deadline, `${where}: deadline`);
      }
      assert.deepEqual(rendered.map((e) => e.index), run.events.map((_, i) => i));
      assert.equal(rendered.at(-1).kind, run.finalKind);
      assert.ok(receiver.complete);
      assert.equal(receiver.stats.keepalives, run.stats.keepalives);
      assert.equal(receiver.stats.undecodable, run.stats.undecodable);
    });
  }
});
