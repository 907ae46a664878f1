// A scripted stand-in for the browser's WebTransport (node has none), shared by the node tests.
import { TOKEN, eloquent as E } from "./helpers.mjs";

const { fromHex } = E;
const tick = () => new Promise((r) => setTimeout(r, 1));

/**
 * A WebTransport class whose server replays `run` (an assembler vector): status line, then its steps in order
 * (datagrams into session.datagrams, control records on the bidi stream). Options: open ("ok" | "fail" | "hang"),
 * status (non-200: that status and a JSON body), loseAfter (lose the session after this many datagrams),
 * failMessage (what a failed open says).
 */
export function fakeWebTransport(run, { open = "ok", status = 200, loseAfter = null, token = TOKEN,
  failMessage = "Opening handshake failed." } = {}) {
  const log = { sessions: [], requests: [], acks: [] };
  class FakeWebTransport {
    constructor(url, init) {
      log.sessions.push({ url, init });
      let ready, fail;
      this.ready = new Promise((resolve, reject) => { ready = resolve; fail = reject; });
      this.closed = new Promise((resolve, reject) => { this.resolveClosed = resolve; this.rejectClosed = reject; });
      this.datagrams = {
        maxDatagramSize: 1211,
        readable: new ReadableStream({ start: (c) => { this.datagramController = c; } }),
        writable: new WritableStream({ write: (chunk) => { log.acks.push(new Uint8Array(chunk)); } }),
      };
      if (open === "ok") setTimeout(ready, 1);
      else if (open === "fail") setTimeout(() => { const e = new Error(failMessage); fail(e); this.rejectClosed(e); }, 1);
    }

    async createBidirectionalStream() {
      let controller;
      const readable = new ReadableStream({ start: (c) => { controller = c; } });
      const parts = [];
      const writable = new WritableStream({
        write: (chunk) => { parts.push(new Uint8Array(chunk)); },
        close: () => { this.serve(E.concatBytes(parts), controller); },
      });
      return { readable, writable };
    }

    async serve(request, controller) {
      const stream = { // the client may cancel its reader at any point: later writes are dropped
        enqueue: (c) => { try { controller.enqueue(c); } catch { /* cancelled */ } },
        close: () => { try { controller.close(); } catch { /* cancelled */ } },
        error: (e) => { try { controller.error(e); } catch { /* cancelled */ } },
      };
      const newline = request.indexOf(0x0a);
      log.requests.push({ head: JSON.parse(new TextDecoder().decode(request.subarray(0, newline))),
        body: new TextDecoder().decode(request.subarray(newline + 1)) });
      const line = (obj) => new TextEncoder().encode(JSON.stringify(obj) + "\n");
      if (status !== 200) {
        stream.enqueue(line({ status, headers: { "content-type": "application/json" } }));
        stream.enqueue(line({ error: { message: "overloaded", type: "server_error", code: status } }));
        stream.close();
        return;
      }
      stream.enqueue(line({ status: 200, headers: { "x-eloquent-stream": token, "eloquent-transport": "datagram",
        "content-type": "application/x-eloquent-control" }, stream_id: run.streamId }));
      let datagrams = 0;
      for (const step of run.steps) {
        await tick();
        if (step.op === "datagram") {
          if (loseAfter !== null && datagrams === loseAfter) {
            const error = new Error("Connection lost.");
            try { this.datagramController.error(error); } catch { /* session closed */ }
            stream.error(error);
            this.rejectClosed(error);
            return;
          }
          datagrams += 1;
          try { this.datagramController.enqueue(fromHex(step.hex)); } catch { /* session closed */ }
        } else if (step.op === "control") {
          stream.enqueue(fromHex(step.hex));
        }
      }
      await tick();
      stream.close();
    }

    close() {
      this.resolveClosed({ closeCode: 0, reason: "" });
    }
  }
  return { FakeWebTransport, log };
}

