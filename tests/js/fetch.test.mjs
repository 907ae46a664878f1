// eloquentFetch (fetch.js): the response body of a datagram stream is byte for byte the SSE the plain path gives
// for the same events; the eloquent-delivery and eloquent-fallback headers; every fallback reason; a session lost
// mid-stream continuing over SSE; abort; non-streaming requests untouched; and the real openai and Vercel AI SDKs
// (tests/js/sdk/node_modules, `npm ci` in ./dev test) parsing the body unchanged.
import assert from "node:assert/strict";
import { after, beforeEach, describe, test } from "node:test";

import { fakeWebTransport } from "./fake_webtransport.mjs";
import { TOKEN, eloquent as E, sseServer, vectors } from "./helpers.mjs";

const RUNS = Object.fromEntries(vectors("assembler").runs.map((r) => [r.name, r]));
const EVENTS = (run) => run.events.map((hex) => new TextDecoder().decode(E.fromHex(hex)));
const BODY = JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }], stream: true });
const POST = { method: "POST", headers: { "content-type": "application/json" }, body: BODY };

const servers = [];
async function server(run = RUNS.acked, options = {}) {
  const s = await sseServer({ events: EVENTS(run), repeat: false, ...options });
  servers.push(s);
  return s;
}
after(async () => { for (const s of servers) await s.close(); });
beforeEach(() => E.forgetWebTransportFailures());

function make(options) {
  const logged = [];
  const f = E.createEloquentFetch({ certificateHash: null, log: (url, why) => logged.push({ url, ...why }), ...options });
  return { f, logged };
}

describe("eloquentFetch: the bytes", () => {
  test("a datagram stream's body is the plain SSE body, byte for byte", async () => {
    const run = RUNS.fallback; // events as datagrams and in a fallback record
    const s = await server(run);
    const plain = await (await fetch(`${s.origin}/v1/chat/completions`, POST)).text();
    const { FakeWebTransport, log } = fakeWebTransport(run);
    const { f, logged } = make({ WebTransport: FakeWebTransport });
    const response = await f(`${s.origin}/v1/chat/completions`, POST);
    assert.equal(response.status, 200);
    assert.equal(response.headers.get("eloquent-delivery"), "datagram");
    assert.equal(response.headers.get("content-type"), "text/event-stream; charset=utf-8");
    assert.equal(response.headers.get("eloquent-transport"), null, "the datagram framing is undone");
    assert.equal(response.headers.get("x-eloquent-stream"), TOKEN);
    assert.equal(response.headers.get("eloquent-fallback"), null);
    assert.equal(response.eloquent.headers["eloquent-transport"], "datagram");
    const body = await response.text();
    assert.equal(body, plain);
    assert.ok(body.startsWith(`id: ${TOKEN}:0\ndata: {`) && body.endsWith(`id: ${TOKEN}:${run.events.length - 1}\ndata: [DONE]\n\n`));
    assert.equal(log.requests[0].head.headers["content-type"], "application/json");
    assert.deepEqual(JSON.parse(log.requests[0].body), JSON.parse(BODY));
    assert.deepEqual(logged, []);
    assert.equal(response.eloquent.delivery, "datagram");
    f.close();
  });

  test("sseBytes: multi-line data and named events as the SSE writer frames them", () => {
    const bytes = E.sseBytes({ id: "t:3", event: "error", data: "a\nb", index: 3 });
    assert.equal(new TextDecoder().decode(bytes), "id: t:3\nevent: error\ndata: a\ndata: b\n\n");
    assert.equal(new TextDecoder().decode(E.sseBytes({ id: null, event: "message", data: "x", index: 2 }, "tok")),
      "id: tok:2\ndata: x\n\n");
  });

  test("a session lost mid-stream: the body goes on over SSE, each event once", async () => {
    const run = RUNS.acked;
    const s = await server(run);
    const plain = await (await fetch(`${s.origin}/v1/chat/completions`, POST)).text();
    const { FakeWebTransport } = fakeWebTransport(run, { loseAfter: 4 });
    const { f } = make({ WebTransport: FakeWebTransport });
    const response = await f(`${s.origin}/v1/chat/completions`, POST);
    assert.equal(response.headers.get("eloquent-delivery"), "datagram");
    assert.equal(await response.text(), plain);
    assert.ok(response.eloquent.fellBack);
    assert.equal(response.eloquent.delivery, "sse");
    assert.ok(s.requests.some((r) => r.headers["last-event-id"]?.startsWith(`${TOKEN}:`)), "resumed with Last-Event-ID");
    f.close();
  });

  test("abort mid-stream: the body fails with AbortError", async () => {
    const s = await server();
    const { FakeWebTransport } = fakeWebTransport(RUNS.acked);
    const { f } = make({ WebTransport: FakeWebTransport });
    const controller = new AbortController();
    const response = await f(`${s.origin}/v1/chat/completions`, { ...POST, signal: controller.signal });
    const reader = response.body.getReader();
    assert.ok((await reader.read()).value.length > 0);
    controller.abort();
    await assert.rejects(reader.read(), (err) => err.name === "AbortError");
    await assert.rejects(f(`${s.origin}/v1/chat/completions`, { ...POST, signal: controller.signal }),
      (err) => err.name === "AbortError");
    f.close();
  });

  test("a refusal on the status line is the server's response, not a throw", async () => {
    const { FakeWebTransport } = fakeWebTransport(RUNS.acked, { status: 503 });
    const { f } = make({ WebTransport: FakeWebTransport });
    const response = await f("https://127.0.0.1:8443/v1/chat/completions", POST);
    assert.equal(response.status, 503);
    assert.equal((await response.json()).error.message, "overloaded");
    assert.equal(response.headers.get("eloquent-delivery"), "h3-stream");
    f.close();
  });

  test("a request that is not a stream is plain fetch (eloquent-delivery: sse)", async () => {
    const s = await server(RUNS.acked, {
      extra: (req, res) => {
        if (req.url !== "/v1/models") return false;
        res.writeHead(200, { "content-type": "application/json" });
        res.end('{"data": [{"id": "m"}]}');
        return true;
      },
    });
    const { FakeWebTransport, log } = fakeWebTransport(RUNS.acked);
    const { f } = make({ WebTransport: FakeWebTransport });
    const response = await f(`${s.origin}/v1/models`);
    assert.equal(response.headers.get("eloquent-delivery"), "sse");
    assert.deepEqual(await response.json(), { data: [{ id: "m" }] });
    assert.equal(log.sessions.length, 0);
    assert.equal(E.isStreaming("POST", new Headers({ "content-type": "application/json" }), '{"stream": false}'), false);
    assert.equal(E.isStreaming("GET", new Headers({ accept: "text/event-stream" }), null), true);
    f.close();
  });
});

describe("eloquentFetch: every fallback says why", () => {
  async function fallbackOf(options, s = null) {
    s ??= await server();
    const { f, logged } = make(options);
    const response = await f(`${s.origin}/v1/chat/completions`, POST);
    const body = await response.text();
    f.close();
    assert.equal(response.headers.get("eloquent-delivery"), "sse");
    assert.equal(body, await (await fetch(`${s.origin}/v1/chat/completions`, POST)).text(), "the same bytes over SSE");
    assert.equal(logged.length, 1);
    assert.equal(logged[0].reason, response.headers.get("eloquent-fallback"));
    assert.deepEqual(response.eloquent.fallback.reason, logged[0].reason);
    return response.eloquent.fallback;
  }

  test("no WebTransport", async () => {
    assert.equal(globalThis.WebTransport, undefined);
    const why = await fallbackOf({ WebTransport: null });
    assert.equal(why.reason, E.FallbackReason.NO_WEBTRANSPORT);
  });

  test("not a secure context", async () => {
    const { FakeWebTransport } = fakeWebTransport(RUNS.acked);
    globalThis.isSecureContext = false;
    try {
      const why = await fallbackOf({ WebTransport: FakeWebTransport });
      assert.equal(why.reason, E.FallbackReason.INSECURE_CONTEXT);
      assert.match(why.message, /secure context/);
    } finally {
      delete globalThis.isSecureContext;
    }
  });

  test("open timed out, then remembered", async () => {
    const { FakeWebTransport, log } = fakeWebTransport(RUNS.acked, { open: "hang" });
    const s = await server();
    const why = await fallbackOf({ WebTransport: FakeWebTransport, webTransportTimeout: 50 }, s);
    assert.equal(why.reason, E.FallbackReason.OPEN_TIMEOUT);
    assert.match(why.message, /did not open in time.*within 50 ms/);
    const again = await fallbackOf({ WebTransport: FakeWebTransport, webTransportTimeout: 50 }, s);
    assert.equal(again.reason, E.FallbackReason.REMEMBERED);
    assert.match(again.message, /did not open in time/);
    assert.equal(log.sessions.length, 1);
  });

  test("a failed origin is tried again after retryAfter, the wait doubling per failure, reset by a session", async (t) => {
    t.mock.timers.enable({ apis: ["Date"], now: 1_000_000 }); // the client's clock only: Date.now, moved by tick()
    const s = await server();
    const failing = fakeWebTransport(RUNS.acked, { open: "fail" });
    const options = { WebTransport: failing.FakeWebTransport, retryAfter: 1000, rememberFailure: 3000 };
    const reason = async (opts = options) => (await fallbackOf(opts, s)).reason;
    assert.equal(await reason(), E.FallbackReason.HANDSHAKE_FAILED);
    t.mock.timers.tick(999);
    assert.equal(await reason(), E.FallbackReason.REMEMBERED);
    assert.equal(failing.log.sessions.length, 1);
    t.mock.timers.tick(2); // past 1 s: tried again, fails again, now skipped for 2 s
    assert.equal(await reason(), E.FallbackReason.HANDSHAKE_FAILED);
    t.mock.timers.tick(1999);
    assert.equal(await reason(), E.FallbackReason.REMEMBERED);
    t.mock.timers.tick(2); // third failure: 4 s, capped at rememberFailure (3 s)
    assert.equal(await reason(), E.FallbackReason.HANDSHAKE_FAILED);
    t.mock.timers.tick(2999);
    assert.equal(await reason(), E.FallbackReason.REMEMBERED);
    t.mock.timers.tick(2);
    assert.equal(failing.log.sessions.length, 3);
    const working = fakeWebTransport(RUNS.acked); // a session that opens forgets the failures
    const { f } = make({ ...options, WebTransport: working.FakeWebTransport });
    const response = await f(`${s.origin}/v1/chat/completions`, POST);
    assert.equal(response.headers.get("eloquent-delivery"), "datagram");
    await response.text();
    f.close();
    assert.equal(await reason(), E.FallbackReason.HANDSHAKE_FAILED);
    t.mock.timers.tick(1001); // counted from the first wait again
    assert.equal(await reason(), E.FallbackReason.HANDSHAKE_FAILED);
  });

  test("certificate refused, and a handshake that fails without a reason", async () => {
    const cert = fakeWebTransport(RUNS.acked, { open: "fail", failMessage: "SEC_ERROR_UNKNOWN_ISSUER: certificate not trusted" });
    assert.equal((await fallbackOf({ WebTransport: cert.FakeWebTransport })).reason, E.FallbackReason.CERTIFICATE_REFUSED);
    E.forgetWebTransportFailures();
    const bare = fakeWebTransport(RUNS.acked, { open: "fail" });
    const why = await fallbackOf({ WebTransport: bare.FakeWebTransport });
    assert.equal(why.reason, E.FallbackReason.HANDSHAKE_FAILED);
    assert.equal(why.detail, "Opening handshake failed.", "what the browser said");
  });

  test("transport sse is not a fallback: no reason, nothing logged", async () => {
    const s = await server();
    const { f, logged } = make({ transport: "sse" });
    const response = await f(`${s.origin}/v1/chat/completions`, POST);
    await response.text();
    assert.equal(response.headers.get("eloquent-fallback"), null);
    assert.deepEqual(logged, []);
    f.close();
  });
});

describe("the real SDKs parse the body unchanged", () => {
  const sdk = (name) => import(new URL(`./sdk/node_modules/${name}`, import.meta.url).href);

  test("openai npm SDK: fetch: eloquentFetch over datagrams gives the plain SSE text", async () => {
    const { default: OpenAI } = await sdk("openai/index.mjs");
    const run = RUNS.fallback;
    const s = await server(run);
    const text = async (fetchFn) => {
      const client = new OpenAI({ baseURL: `${s.origin}/v1`, apiKey: "sk-test", fetch: fetchFn, maxRetries: 0 });
      const { data, response } = await client.chat.completions.create({ model: "m", stream: true,
        messages: [{ role: "user", content: "hi" }] }).withResponse();
      let out = "";
      for await (const chunk of data) out += chunk.choices[0]?.delta?.content ?? "";
      return { out, delivery: response.headers.get("eloquent-delivery") };
    };
    const { FakeWebTransport } = fakeWebTransport(run);
    const { f } = make({ WebTransport: FakeWebTransport });
    const [viaEloquent, viaPlain] = [await text(f), await text(fetch)];
    assert.equal(viaEloquent.delivery, "datagram");
    assert.ok(viaEloquent.out.length > 0);
    assert.equal(viaEloquent.out, viaPlain.out);
    f.close();
  });

  test("Vercel AI SDK: createOpenAI({fetch: eloquentFetch}) + streamText gives the plain SSE text", async () => {
    const { createOpenAI } = await sdk("@ai-sdk/openai/dist/index.mjs");
    const { streamText } = await sdk("ai/dist/index.mjs");
    const run = RUNS.fallback;
    const s = await server(run);
    const text = async (fetchFn) => {
      const provider = createOpenAI({ baseURL: `${s.origin}/v1`, apiKey: "sk-test", fetch: fetchFn });
      const result = streamText({ model: provider.chat("m"), prompt: "hi", maxRetries: 0 });
      let out = "";
      for await (const part of result.fullStream) {
        if (part.type === "text-delta") out += part.text;
        if (part.type === "error") throw part.error;
      }
      return { out, headers: (await result.response).headers };
    };
    const { FakeWebTransport } = fakeWebTransport(run);
    const { f } = make({ WebTransport: FakeWebTransport });
    const [viaEloquent, viaPlain] = [await text(f), await text(fetch)];
    assert.equal(viaEloquent.headers["eloquent-delivery"], "datagram");
    assert.ok(viaEloquent.out.length > 0);
    assert.equal(viaEloquent.out, viaPlain.out);
    f.close();
  });
});
