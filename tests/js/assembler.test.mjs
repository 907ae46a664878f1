// assembler.js against core/assembler.py: datagrams and control records from tests/vectors/assembler.json
// (tests/support/make_vectors.py).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { EloquentAssembler } from "../../eloquent_plugins/static/assembler.js";
import { fromHex, toHex } from "../../eloquent_plugins/static/bytes.js";
import { EloquentError } from "../../eloquent_plugins/static/errors.js";
import { vectors } from "./helpers.mjs";

describe("assembler: datagrams + control records", () => {
  for (const run of vectors("assembler").runs) {
    test(run.name, () => {
      const asm = new EloquentAssembler(run.streamId);
      for (const [i, step] of run.steps.entries()) {
        const where = `${run.name} step ${i} (${step.op})`;
        let got = {};
        try {
          if (step.op === "datagram") {
            const events = asm.onDatagram(fromHex(step.hex), step.t);
            got = { rendered: events.map((e) => e.index), acks: asm.acks(step.t).map(toHex) };
            for (const e of events) assert.equal(toHex(e.payload), e.index < run.events.length ? run.events[e.index] : run.final.payload, where);
          } else if (step.op === "control") {
            const events = asm.onControl(fromHex(step.hex));
            got = { rendered: events.map((e) => e.index) };
          } else {
            asm.onStreamEnd();
          }
        } catch (err) {
          assert.ok(err instanceof EloquentError, `${where}: ${err.stack}`);
          got = { error: err.name };
        }
        const want = {};
        for (const key of ["rendered", "acks", "error"]) if (step[key] !== undefined) want[key] = step[key];
        if (want.error) assert.equal(got.error, want.error, where);
        else assert.deepEqual(got, want, where);
      }
    });
  }
});
