// Shared by the node tests: the client module and the vectors the Python core wrote (tests/vectors/).
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export * as eloquent from "../../client/js/eloquent.js";

const here = dirname(fileURLToPath(import.meta.url));
export const VECTORS = join(here, "..", "vectors");

export function vectors(name) {
  return JSON.parse(readFileSync(join(VECTORS, `${name}.json`), "utf8"));
}

/** The class name of what `fn` throws (null if it returns). */
export function thrownName(fn) {
  try {
    fn();
  } catch (err) {
    return err.name;
  }
  return null;
}

export const TOKEN = "TestToken_0123456789-abc";

/** An OpenAI chat chunk with `text`. */
export function chunk(text) {
  return JSON.stringify({ id: "chatcmpl-1", object: "chat.completion.chunk", created: 1, model: "m",
    choices: [{ index: 0, delta: { content: text }, finish_reason: null }] });
}

/**
 * A tiny server that streams `events` (data strings) as the Eloquent SSE middleware does (ids `<token>:<i>`,
 * header x-eloquent-stream) and honours Last-Event-ID. `cuts[n]` = after how many events the n-th response is
 * cut mid-event (the socket destroyed); `repeat` replays one event already delivered on each resume (the client
 * must skip it). `extra(req, res)` may answer a request itself (return true).
 */
export async function sseServer({ events, token = TOKEN, cuts = [], repeat = true, sendToken = true, extra } = {}) {
  const { createServer } = await import("node:http");
  const requests = [];
  const server = createServer(async (req, res) => {
    let body = "";
    for await (const piece of req) body += piece;
    requests.push({ method: req.method, url: req.url, headers: req.headers, body });
    if (extra && (await extra(req, res, body))) return;
    const last = req.headers["last-event-id"];
    let from = 0;
    if (last !== undefined) {
      const [tok, index] = last.includes(":") ? [last.slice(0, last.lastIndexOf(":")), last.slice(last.lastIndexOf(":") + 1)] : [last, "-1"];
      if (tok !== token) {
        res.writeHead(404, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { message: "stream not found", type: "invalid_request_error", code: "stream_not_found" } }));
        return;
      }
      from = Number(index) + 1;
      if (repeat && from > 0) from -= 1;
    }
    const headers = { "content-type": "text/event-stream", "cache-control": "no-cache" };
    if (sendToken) headers["x-eloquent-stream"] = token;
    res.writeHead(200, headers);
    const cut = cuts[requests.filter((r) => r.url === req.url).length - 1];
    for (let i = from; i < events.length; i++) {
      const frame = `id: ${token}:${i}\ndata: ${events[i]}\n\n`;
      if (cut !== undefined && i - from === cut) {
        res.write(frame.slice(0, 9)); // half an event, then the connection dies
        await new Promise((r) => setTimeout(r, 20));
        res.socket.destroy();
        return;
      }
      res.write(frame);
      await new Promise((r) => setTimeout(r, 2));
    }
    res.end();
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const origin = `http://127.0.0.1:${server.address().port}`;
  return { origin, requests, close: () => new Promise((resolve) => { server.closeAllConnections(); server.close(resolve); }) };
}

/** Every event of a stream (and the stream), read to the end. */
export async function drain(stream) {
  const events = [];
  for await (const e of stream.events()) events.push(e);
  return events;
}
