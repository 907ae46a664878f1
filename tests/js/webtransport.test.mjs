// EloquentClient over WebTransport, against a scripted stand-in for the browser's WebTransport (node has none):
// the request on a bidirectional stream, the status line, control records, datagrams from the Python core's
// vectors, acks back; `auto` falling back to SSE; a session lost mid-stream continuing over SSE exactly once.
import assert from "node:assert/strict";
import { beforeEach, describe, test } from "node:test";

import { fakeWebTransport } from "./fake_webtransport.mjs";
import { TOKEN, drain, eloquent as E, sseServer, vectors } from "./helpers.mjs";

const { fromHex, toHex } = E;
const RUNS = Object.fromEntries(vectors("assembler").runs.map((r) => [r.name, r]));
const HASH = "q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80="; // 32 bytes, base64
const BODY = { messages: [{ role: "user", content: "hi" }], stream: true };

function textOf(hex) {
  return new TextDecoder().decode(fromHex(hex));
}

/** The SSE form of an assembler run's events (what the SSE port would stream for the same stream). */
function sseEvents(run) {
  return run.events.map(textOf);
}

beforeEach(() => E.forgetWebTransportFailures());

describe("WebTransport delivery", () => {
  test("events as datagrams, the trailer and a fallback record: each event once, acks sent", async () => {
    const run = RUNS.fallback;
    const { FakeWebTransport, log } = fakeWebTransport(run);
    const client = new E.EloquentClient("https://127.0.0.1:8443", { WebTransport: FakeWebTransport, certificateHash: HASH });
    const stream = await client.stream("/v1/chat/completions", BODY, { headers: { "X-User": "u1" } });
    assert.equal(stream.delivery, "webtransport");
    assert.equal(stream.token, TOKEN);
    const events = await drain(stream);
    assert.deepEqual(events.map((e) => e.index), run.events.map((_, i) => i));
    assert.deepEqual(events.map((e) => e.data), sseEvents(run));
    assert.ok(events.every((e) => e.kind === "data"));
    assert.equal(stream.delivery, "webtransport");
    assert.ok(stream.wt.stats.fallbackEvents > 0, "the run's fallback record carried events");
    // The session: URL, certificate hash; the request: one JSON head line, then the body.
    assert.equal(log.sessions.length, 1);
    assert.equal(log.sessions[0].url, "https://127.0.0.1:8443/eloquent/wt");
    const [hash] = log.sessions[0].init.serverCertificateHashes;
    assert.equal(hash.algorithm, "sha-256");
    assert.equal(E.base64Encode(hash.value), HASH);
    const [request] = log.requests;
    assert.equal(request.head.method, "POST");
    assert.equal(request.head.path, "/v1/chat/completions");
    assert.equal(request.head.headers["eloquent-transport"], "datagram");
    assert.equal(request.head.headers["x-user"], "u1");
    assert.equal(request.head.headers["content-type"], "application/json");
    assert.deepEqual(JSON.parse(request.body), BODY);
    // Acks: the same bytes as the Python assembler sent for the same datagrams, up to the ack delay field.
    const acks = log.acks.map((a) => E.decodePacket(a));
    const want = run.steps.filter((s) => s.op === "datagram").flatMap((s) => s.acks).map((h) => E.decodePacket(fromHex(h)));
    assert.deepEqual(acks.map((a) => [a.streamId, a.nextExpected, a.largestPacketNumber]),
      want.map((a) => [a.streamId, a.nextExpected, a.largestPacketNumber]));
    client.close();
  });

  test("an in-band error: StreamFailed from textDeltas", async () => {
    const run = RUNS.error;
    const { FakeWebTransport } = fakeWebTransport(run);
    const client = new E.EloquentClient("https://127.0.0.1:8443", { transport: "webtransport", WebTransport: FakeWebTransport, certificateHash: null });
    const stream = await client.stream("/v1/chat/completions", BODY);
    const deltas = [];
    await assert.rejects(async () => { for await (const d of stream.textDeltas()) deltas.push(d); }, (err) => {
      assert.ok(err instanceof E.StreamFailed);
      assert.equal(err.payload.message, "engine died");
      return true;
    });
    const want = run.events.map(textOf).map((d) => E.textDelta(d)).filter(Boolean);
    assert.deepEqual(deltas, want);
    assert.equal(stream.rendered.at(-1).kind, "error");
    client.close();
  });

  test("a digest that does not match: IncompleteStream", async () => {
    const { FakeWebTransport } = fakeWebTransport(RUNS.tampered);
    const client = new E.EloquentClient("https://127.0.0.1:8443", { WebTransport: FakeWebTransport, certificateHash: null });
    const stream = await client.stream("/v1/chat/completions", BODY);
    await assert.rejects(drain(stream), E.IncompleteStream);
    client.close();
  });

  test("a refusal on the status line: HTTPStatusError", async () => {
    const { FakeWebTransport } = fakeWebTransport(RUNS.acked, { status: 503 });
    const client = new E.EloquentClient("https://127.0.0.1:8443", { WebTransport: FakeWebTransport, certificateHash: null });
    await assert.rejects(client.stream("/v1/chat/completions", BODY), (err) => {
      assert.ok(err instanceof E.HTTPStatusError);
      assert.equal(err.status, 503);
      assert.equal(err.body.error.message, "overloaded");
      return true;
    });
    client.close();
  });

  test("certificateHash auto: GET /eloquent/cert-hash; Alt-Svc names the HTTP/3 port", async () => {
    const run = RUNS.acked;
    const server = await sseServer({
      events: sseEvents(run),
      extra: (req, res) => {
        if (req.url !== "/eloquent/cert-hash") return false;
        res.writeHead(200, { "content-type": "application/json", "alt-svc": 'h3=":4433"; ma=86400' });
        res.end(JSON.stringify({ algorithm: "sha-256", value: HASH }));
        return true;
      },
    });
    try {
      const { FakeWebTransport, log } = fakeWebTransport(run);
      const client = new E.EloquentClient(server.origin, { WebTransport: FakeWebTransport });
      const stream = await client.stream("/v1/chat/completions", BODY);
      assert.equal((await drain(stream)).length, run.events.length);
      assert.equal(log.sessions[0].url, "https://127.0.0.1:4433/eloquent/wt");
      assert.equal(E.base64Encode(log.sessions[0].init.serverCertificateHashes[0].value), HASH);
      // The session is reused for the next request.
      await drain(await client.stream("/v1/chat/completions", BODY));
      assert.equal(log.sessions.length, 1);
      assert.equal(log.requests.length, 2);
      client.close();
    } finally {
      await server.close();
    }
  });
});

describe("falling back to SSE", () => {
  test("auto: a session that fails to open goes over SSE, and the origin is remembered", async () => {
    const run = RUNS.acked;
    const server = await sseServer({ events: sseEvents(run) });
    try {
      const { FakeWebTransport, log } = fakeWebTransport(run, { open: "fail" });
      const client = new E.EloquentClient(server.origin, { WebTransport: FakeWebTransport, certificateHash: null });
      const first = await client.stream("/v1/chat/completions", BODY);
      assert.equal(first.delivery, "sse");
      assert.deepEqual((await drain(first)).map((e) => e.data), sseEvents(run));
      const second = await client.stream("/v1/chat/completions", BODY);
      assert.equal(second.delivery, "sse");
      await drain(second);
      assert.equal(log.sessions.length, 1, "a failed origin is not tried again at once");
    } finally {
      await server.close();
    }
  });

  test("auto: a session that never opens times out into SSE", async () => {
    const run = RUNS.acked;
    const server = await sseServer({ events: sseEvents(run) });
    try {
      const { FakeWebTransport } = fakeWebTransport(run, { open: "hang" });
      const client = new E.EloquentClient(server.origin, { WebTransport: FakeWebTransport, certificateHash: null, webTransportTimeout: 50 });
      const started = Date.now();
      const stream = await client.stream("/v1/chat/completions", BODY);
      assert.equal(stream.delivery, "sse");
      assert.ok(Date.now() - started < 2000);
      await drain(stream);
    } finally {
      await server.close();
    }
  });

  test("webtransport only: a failed session is an error", async () => {
    const { FakeWebTransport } = fakeWebTransport(RUNS.acked, { open: "fail" });
    const client = new E.EloquentClient("https://127.0.0.1:1", { transport: "webtransport", WebTransport: FakeWebTransport, certificateHash: null });
    await assert.rejects(client.stream("/v1/chat/completions", BODY), E.ClientError);
    const plain = new E.EloquentClient("https://127.0.0.1:1", { transport: "webtransport", WebTransport: null, certificateHash: null });
    if (globalThis.WebTransport === undefined) await assert.rejects(plain.stream("/v1/chat/completions", BODY), E.ClientError);
  });

  test("a session lost mid-stream continues over SSE from the last rendered event, exactly once", async () => {
    const run = RUNS.acked;
    const server = await sseServer({ events: sseEvents(run) });
    try {
      const { FakeWebTransport } = fakeWebTransport(run, { loseAfter: 4 });
      const client = new E.EloquentClient(server.origin, { WebTransport: FakeWebTransport, certificateHash: null });
      const stream = await client.stream("/v1/chat/completions", BODY, { headers: { "x-user": "u2" } });
      assert.equal(stream.delivery, "webtransport");
      const events = await drain(stream);
      assert.deepEqual(events.map((e) => e.index), run.events.map((_, i) => i));
      assert.deepEqual(events.map((e) => e.data), sseEvents(run));
      assert.equal(stream.delivery, "sse");
      assert.ok(stream.fellBack);
      const viaWT = run.steps.filter((s) => s.op === "datagram").slice(0, 4).flatMap((s) => s.rendered);
      assert.ok(viaWT.length > 0);
      const resume = server.requests.find((r) => r.url === "/v1/chat/completions");
      assert.equal(resume.headers["last-event-id"], `${TOKEN}:${Math.max(...viaWT)}`);
      assert.equal(resume.headers["x-user"], "u2");
      assert.deepEqual(JSON.parse(resume.body), BODY);
    } finally {
      await server.close();
    }
  });

  test("a session lost before any event resumes over SSE from the start (bare token)", async () => {
    const run = RUNS.acked;
    const server = await sseServer({ events: sseEvents(run) });
    try {
      const { FakeWebTransport } = fakeWebTransport(run, { loseAfter: 0 });
      const client = new E.EloquentClient(server.origin, { WebTransport: FakeWebTransport, certificateHash: null });
      const stream = await client.stream("/v1/chat/completions", BODY);
      const events = await drain(stream);
      assert.deepEqual(events.map((e) => e.index), run.events.map((_, i) => i));
      assert.equal(server.requests[0].headers["last-event-id"], TOKEN);
    } finally {
      await server.close();
    }
  });
});

test("hex helpers round-trip", () => {
  assert.equal(toHex(fromHex("00ff10")), "00ff10");
});
