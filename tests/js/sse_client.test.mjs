// EloquentClient over SSE: resume after a cut exactly once, typed errors; and against a real `eloquent serve`
// when the pytest side passes its origin in ELOQUENT_TEST_ORIGIN.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { TOKEN, chunk, drain, eloquent as E, sseServer } from "./helpers.mjs";

const WORDS = Array.from({ length: 12 }, (_, i) => `w${i} `);
const EVENTS = [...WORDS.map(chunk), "[DONE]"];
const BODY = { model: "m", messages: [{ role: "user", content: "hi" }], stream: true };

describe("SSE resume", () => {
  test("a cut mid-event resumes with Last-Event-ID, each event exactly once", async () => {
    const server = await sseServer({ events: EVENTS, cuts: [5, 3] });
    try {
      const client = new E.EloquentClient(server.origin, { transport: "sse", backoff: 5 });
      const stream = await client.stream("/v1/chat/completions", BODY);
      assert.equal(stream.delivery, "sse");
      assert.equal(stream.token, TOKEN);
      const events = await drain(stream);
      assert.deepEqual(events.map((e) => e.index), EVENTS.map((_, i) => i));
      assert.deepEqual(events.map((e) => e.data), EVENTS);
      assert.deepEqual(events.map((e) => e.id), EVENTS.map((_, i) => `${TOKEN}:${i}`));
      assert.equal(server.requests.length, 3);
      assert.equal(server.requests[0].headers["last-event-id"], undefined);
      assert.equal(server.requests[1].headers["last-event-id"], `${TOKEN}:4`);
      assert.equal(server.requests[2].headers["last-event-id"], `${TOKEN}:6`); // 4 (a repeat), 5, 6, cut
      for (const r of server.requests) {
        assert.deepEqual(JSON.parse(r.body), BODY);
        assert.equal(r.headers["content-type"], "application/json");
        assert.equal(r.headers.accept, "text/event-stream");
      }
      assert.ok(events.every((e) => typeof e.renderedAt === "number"));
    } finally {
      await server.close();
    }
  });

  test("textDeltas across a cut", async () => {
    const server = await sseServer({ events: EVENTS, cuts: [2] });
    try {
      const client = new E.EloquentClient(server.origin, { backoff: 5 }); // auto: node has no WebTransport
      const stream = await client.stream("/v1/chat/completions", BODY, { headers: { "x-user": "u1" } });
      const deltas = [];
      for await (const d of stream.textDeltas()) deltas.push(d);
      assert.deepEqual(deltas, WORDS);
      assert.equal(stream.delivery, "sse");
      assert.equal(server.requests[1].headers["x-user"], "u1");
    } finally {
      await server.close();
    }
  });

  test("a cut before the first event resumes from the start with the bare token", async () => {
    const server = await sseServer({ events: EVENTS, cuts: [0] });
    try {
      const stream = await new E.EloquentClient(server.origin, { transport: "sse", backoff: 5 }).stream("/v1/chat/completions", BODY);
      const events = await drain(stream);
      assert.deepEqual(events.map((e) => e.index), EVENTS.map((_, i) => i));
      assert.equal(server.requests[1].headers["last-event-id"], TOKEN);
    } finally {
      await server.close();
    }
  });

  test("no resume token: the cut surfaces as IncompleteStream", async () => {
    const server = await sseServer({ events: EVENTS, cuts: [3], sendToken: false });
    try {
      const stream = await new E.EloquentClient(server.origin, { transport: "sse", backoff: 5, maxRetries: 0 }).stream("/x", BODY);
      const seen = [];
      await assert.rejects(async () => { for await (const e of stream.events()) seen.push(e.index); }, E.IncompleteStream);
      assert.deepEqual(seen, [0, 1, 2]);
    } finally {
      await server.close();
    }
  });

  test("an expired resume is an HTTPStatusError", async () => {
    const server = await sseServer({
      events: EVENTS,
      cuts: [2],
      extra: (req, res) => {
        if (req.headers["last-event-id"] === undefined) return false;
        res.writeHead(404, { "content-type": "application/json" }); // the server forgot the stream
        res.end(JSON.stringify({ error: { message: "no such stream", type: "invalid_request_error", code: "stream_not_found" } }));
        return true;
      },
    });
    try {
      const stream = await new E.EloquentClient(server.origin, { transport: "sse", backoff: 5 }).stream("/v1/chat/completions", BODY);
      const seen = [];
      await assert.rejects(async () => { for await (const e of stream.events()) seen.push(e.index); }, (err) => {
        assert.ok(err instanceof E.HTTPStatusError && err instanceof E.ClientError, String(err));
        assert.equal(err.status, 404);
        assert.equal(err.body.error.code, "stream_not_found");
        return true;
      });
      assert.deepEqual(seen, [0, 1]);
      assert.equal(server.requests[1].headers["last-event-id"], `${TOKEN}:1`);
    } finally {
      await server.close();
    }
  });
});

describe("SSE errors", () => {
  test("a refused request raises HTTPStatusError from stream()", async () => {
    const server = await sseServer({
      events: EVENTS,
      extra: (req, res) => {
        res.writeHead(429, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { message: "too many", type: "rate_limit", code: 429 } }));
        return true;
      },
    });
    try {
      const client = new E.EloquentClient(server.origin, { transport: "sse" });
      await assert.rejects(client.stream("/v1/chat/completions", BODY), (err) => {
        assert.ok(err instanceof E.HTTPStatusError);
        assert.equal(err.status, 429);
        assert.equal(err.body.error.message, "too many");
        return true;
      });
    } finally {
      await server.close();
    }
  });

  test("an in-band error raises StreamFailed after the text before it", async () => {
    const error = JSON.stringify({ error: { message: "engine died", type: "InternalServerError", code: 500 } });
    const server = await sseServer({ events: [chunk("a"), chunk("b"), error, "[DONE]"] });
    try {
      const stream = await new E.EloquentClient(server.origin, { transport: "sse" }).stream("/v1/chat/completions", BODY);
      const deltas = [];
      await assert.rejects(async () => { for await (const d of stream.textDeltas()) deltas.push(d); }, (err) => {
        assert.ok(err instanceof E.StreamFailed);
        assert.equal(err.payload.message, "engine died");
        return true;
      });
      assert.deepEqual(deltas, ["a", "b"]);
    } finally {
      await server.close();
    }
  });

  test("nothing listening: ClientError", async () => {
    const client = new E.EloquentClient("http://127.0.0.1:9", { transport: "sse" });
    await assert.rejects(client.stream("/v1/chat/completions", BODY), (err) => err instanceof E.ClientError);
  });

  test("bad options", () => {
    assert.throws(() => new E.EloquentClient("ftp://x"), E.ConfigError);
    assert.throws(() => new E.EloquentClient("http://x", { transport: "carrier-pigeon" }), E.ConfigError);
  });

  test("events() reads once", async () => {
    const server = await sseServer({ events: EVENTS });
    try {
      const stream = await new E.EloquentClient(server.origin, { transport: "sse" }).stream("/v1/chat/completions", BODY);
      assert.equal((await stream.text()), WORDS.join(""));
      await assert.rejects(drain(stream), E.ClientError);
    } finally {
      await server.close();
    }
  });
});

describe("leaving early", () => {
  test("breaking out of events() closes the response; an abort signal stops the stream", async () => {
    const server = await sseServer({ events: EVENTS });
    try {
      const client = new E.EloquentClient(server.origin, { transport: "sse" });
      const stream = await client.stream("/v1/chat/completions", BODY);
      const seen = [];
      for await (const e of stream.events()) {
        seen.push(e.index);
        if (e.index === 2) break;
      }
      assert.deepEqual(seen, [0, 1, 2]);
      const abort = new AbortController();
      const second = await client.stream("/v1/chat/completions", BODY, { signal: abort.signal });
      await assert.rejects(async () => {
        for await (const e of second.events()) if (e.index === 1) abort.abort();
      }, (err) => err.name === "AbortError");
      assert.equal(server.requests.length, 2, "an abort is not a cut: no resume");
    } finally {
      await server.close();
    }
  });
});

/** A fetch whose first response body dies in the middle of its event number `events` + 1, however the bytes
 * come in chunks (the connection cut under the client). */
function cuttingFetch(events) {
  let calls = 0;
  const fetched = [];
  async function cutting(url, init) {
    calls += 1;
    fetched.push(init.headers);
    if (calls > 1) return fetch(url, init);
    const abort = new AbortController();
    const response = await fetch(url, { ...init, signal: abort.signal });
    const reader = response.body.getReader();
    let blankLines = 0, previous = -1, cutAt = null, passed = 0;
    const body = new ReadableStream({
      async pull(controller) {
        const { value, done } = await reader.read();
        if (done) return controller.close();
        for (let i = 0; i < value.length && cutAt === null; i++) {
          if (value[i] === 0x0a && previous === 0x0a && ++blankLines === events) cutAt = passed + i + 10;
          previous = value[i];
        }
        if (cutAt !== null && passed + value.length > cutAt) {
          controller.enqueue(value.subarray(0, cutAt - passed));
          abort.abort();
          controller.error(new TypeError("terminated"));
          return;
        }
        passed += value.length;
        controller.enqueue(value);
      },
    });
    return new Response(body, { status: response.status, headers: response.headers });
  }
  return { fetch: cutting, fetched };
}

const ORIGIN = process.env.ELOQUENT_TEST_ORIGIN;
describe("against eloquent serve", { skip: ORIGIN ? false : "ELOQUENT_TEST_ORIGIN not set" }, () => {
  const CHAT = { messages: [{ role: "user", content: "hello from node" }], max_tokens: 12, stream: true };
  let whole;

  test("streams the text the engine generates", async () => {
    const response = await fetch(`${ORIGIN}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ ...CHAT, stream: false }) });
    whole = (await response.json()).choices[0].message.content;
    const client = new E.EloquentClient(ORIGIN);
    const stream = await client.stream("/v1/chat/completions", CHAT);
    assert.equal(stream.delivery, "sse");
    assert.match(stream.token, /^[A-Za-z0-9_-]{16,64}$/);
    const events = await drain(stream);
    assert.equal(events.at(-1).data, "[DONE]");
    assert.deepEqual(events.map((e) => e.index), events.map((_, i) => i));
    assert.equal(events.map((e) => e.text ?? "").join(""), whole);
  });

  test("resumes a cut stream exactly once (Last-Event-ID)", async () => {
    const { fetch: cutting, fetched } = cuttingFetch(3);
    // cut mid-event 4: the resume asks for what follows event 2
    const client = new E.EloquentClient(ORIGIN, { transport: "sse", fetch: cutting, backoff: 20 });
    const stream = await client.stream("/v1/chat/completions", CHAT);
    const events = await drain(stream);
    assert.ok(fetched.length >= 2, "the stream was not cut");
    assert.equal(fetched[1]["last-event-id"], `${stream.token}:2`);
    assert.deepEqual(events.map((e) => e.index), events.map((_, i) => i));
    assert.equal(events.at(-1).data, "[DONE]");
    assert.equal(events.map((e) => e.text ?? "").join(""), whole);
  });
});
