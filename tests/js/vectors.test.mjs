// The JS client against the Python core, byte for byte: every vector in tests/vectors/ (tests/support/make_vectors.py).
import { createHash } from "node:crypto";
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { eloquent as E, thrownName, vectors } from "./helpers.mjs";

const { fromHex, toHex } = E;

function packetJson(p) {
  if (p.type !== "data") return p;
  return { ...p, entries: p.entries.map((e) => ({ ...e, middle: toHex(e.middle) })) };
}
function packetFromJson(p) {
  if (p.type !== "data") return p;
  return { ...p, entries: p.entries.map((e) => ({ ...e, middle: fromHex(e.middle) })) };
}

describe("varint", () => {
  const v = vectors("varint");
  test("encode and decode like Python", () => {
    for (const { value, hex } of v.values) {
      assert.equal(toHex(E.encodeVarint(value)), hex, `encode ${value}`);
      assert.deepEqual(E.decodeVarint(fromHex(hex), 0), [value, hex.length / 2]);
    }
  });
  test("62-bit values as BigInt; above 2^53 a number decode refuses", () => {
    for (const { value, hex } of v.big) {
      assert.equal(toHex(E.encodeVarint(BigInt(value))), hex);
      assert.deepEqual(E.decodeVarintBig(fromHex(hex), 0), [BigInt(value), 8]);
      assert.equal(thrownName(() => E.decodeVarint(fromHex(hex), 0)), "LimitExceeded");
    }
  });
  test("truncated", () => {
    for (const hex of v.truncated) assert.equal(thrownName(() => E.decodeVarint(fromHex(hex), 0)), "DecodeError");
  });
});

describe("packets", () => {
  const v = vectors("packets");
  test("valid packets decode and re-encode identically", () => {
    for (const { hex, packet } of v.valid) {
      assert.deepEqual(packetJson(E.decodePacket(fromHex(hex))), packet);
      assert.equal(toHex(E.encodePacket(packetFromJson(packet))), hex);
    }
  });
  test("odd packets: the same outcome, the same error class", () => {
    for (const c of v.odd) {
      const limits = c.limits ? E.makeLimits(c.limits) : E.DEFAULT_LIMITS;
      let got;
      try {
        got = { packet: packetJson(E.decodePacket(fromHex(c.hex), limits)) };
      } catch (err) {
        assert.ok(err instanceof E.ProtocolError, `${c.hex}: ${err}`);
        got = { error: err.name };
      }
      assert.deepEqual(got, c.error ? { error: c.error } : { packet: c.packet }, c.hex);
    }
  });
  test("padded packets (zero bytes after the last field) decode as the packet without them", () => {
    assert.ok(v.padded.length > 0);
    for (const { hex, size, packet } of v.padded) {
      assert.equal(hex.length / 2, size);
      assert.deepEqual(packetJson(E.decodePacket(fromHex(hex))), packet);
    }
  });
  test("deltas", () => {
    for (const d of v.deltas) {
      const [prefix, suffix, middle] = E.makeDelta(fromHex(d.ref), fromHex(d.payload));
      assert.deepEqual([prefix, suffix, toHex(middle)], [d.prefix, d.suffix, d.middle]);
      assert.equal(toHex(E.applyDelta(fromHex(d.ref), prefix, suffix, middle)), d.payload);
    }
  });
});

describe("receiver under scripted loss", () => {
  for (const run of vectors("receiver").runs) {
    test(run.name, () => {
      const receiver = new E.EloquentReceiver(run.streamId, { limits: E.makeLimits(run.limits), ackDelay: run.ackDelay });
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

describe("assembler: datagrams + control records", () => {
  for (const run of vectors("assembler").runs) {
    test(run.name, () => {
      const asm = new E.EloquentAssembler(run.streamId);
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
          assert.ok(err instanceof E.EloquentError, `${where}: ${err.stack}`);
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

describe("control records", () => {
  const v = vectors("control");
  test("stream digests", () => {
    for (const d of v.digests) assert.equal(E.StreamDigest.of(d.payloads.map(fromHex)), d.sha256);
  });
  test("records parse and re-encode identically", () => {
    for (const r of v.records) {
      const bytes = fromHex(r.hex);
      const parser = new E.ControlParser();
      const records = [...parser.feed(bytes.subarray(0, 5)), ...parser.feed(bytes.subarray(5))];
      assert.equal(records.length, 1);
      const [rec] = records;
      assert.equal(rec.type, r.type);
      const events = rec.type === "trailer" ? [rec.final] : rec.events;
      assert.deepEqual(events.map((e) => ({ index: e.index, kind: e.kind, payload: toHex(e.payload) })), r.events);
      if (rec.type === "trailer") {
        assert.deepEqual([rec.count, rec.sha256], [r.count, r.sha256]);
        assert.equal(toHex(E.encodeTrailer(rec)), r.hex);
      } else {
        assert.equal(toHex(E.encodeFallback(rec.events)), r.hex);
      }
    }
  });
  test("bad records raise the same errors", () => {
    for (const { line, error } of v.invalid) {
      assert.equal(thrownName(() => new E.ControlParser().feed(new TextEncoder().encode(line + "\n"))), error, line);
    }
  });
  test("a record cut by the end of the stream", () => {
    const parser = new E.ControlParser();
    parser.feed(new TextEncoder().encode('{"type":"fall'));
    assert.equal(thrownName(() => parser.close()), "DecodeError");
  });
  test("sha-256 agrees with node:crypto", () => {
    for (const n of [0, 1, 55, 56, 63, 64, 65, 119, 120, 127, 128, 1000, 1 << 20]) {
      const data = new Uint8Array(n).map((_, i) => (i * 31 + 7) & 0xff);
      const h = new E.Sha256();
      h.update(data.subarray(0, n >> 1));
      h.update(data.subarray(n >> 1));
      assert.equal(h.hexdigest(), createHash("sha256").update(data).digest("hex"), `length ${n}`);
    }
  });
});

describe("SSE parser", () => {
  const v = vectors("sse");
  for (const c of v.cases) {
    test(c.name, () => {
      const stream = fromHex(c.hex);
      for (const run of c.runs) {
        const parser = new E.SSEParser();
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
    const parser = new E.SSEParser({ maxMessageBytes: v.overflow.maxMessageBytes });
    assert.equal(thrownName(() => parser.feed(fromHex(v.overflow.hex))), v.overflow.error);
  });
});

describe("codecs", () => {
  const v = vectors("codecs");
  for (const [name, cases] of Object.entries(v.views)) {
    test(name, () => {
      for (const c of cases) {
        let got;
        try {
          got = { payload: c.payload, view: E.CODECS[name].parse(new TextEncoder().encode(c.payload)) };
        } catch (err) {
          got = { payload: c.payload, error: err.name };
        }
        assert.deepEqual(got, c, c.payload);
      }
    });
  }
  test("textDelta", () => {
    for (const { data, text } of v.textDelta) assert.equal(E.textDelta(data), text, data);
  });
});

test("event ids", () => {
  for (const c of vectors("event_ids")) {
    let got;
    try {
      const p = E.parseEventId(c.value);
      got = { value: c.value, token: p.token, after: p.after };
    } catch (err) {
      got = { value: c.value, error: err.name };
    }
    assert.deepEqual(got, c);
  }
});
