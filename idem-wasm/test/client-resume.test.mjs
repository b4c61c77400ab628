// idempotentFetch with a persisted entry met again under its id: an outcome still unknown is
// kept whatever `reconcile` says, so that the id never sends under a new key while the first
// may have run; an entry over or waiting to ask is never taken for another payload's or sent.
// Against a local server (127.0.0.1, OS-chosen port) in front of withIdempotency.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { MemoryStore, withIdempotency } from "idem";
import { idempotentFetch, reconcile } from "idem/client";
import { serve } from "./helpers.mjs";

const FAST = { base: 5, cap: 20, maxAttempts: 3, deadline: 5_000 };
const STATUS_TYPE = "application/vnd.idem.key-status+json";

/** An order API whose every answer is lost after the order ran while `lose()` says so. */
async function orderServer(lose) {
  const state = { executions: 0, keys: [], requests: 0 };
  const api = withIdempotency(
    async (request) => {
      state.executions++;
      return Response.json({ id: state.executions, order: await request.text() }, { status: 201 });
    },
    { principal: "none", store: new MemoryStore() },
  );
  const server = await serve(async (request, { res }) => {
    state.requests++;
    state.keys.push(request.headers.get("idempotency-key"));
    if (lose()) {
      await (await api(request)).arrayBuffer();
      res.socket.destroy();
      return null;
    }
    return api(request);
  });
  return { server, state };
}

function memory() {
  const saved = new Map();
  return {
    saved,
    load: async (id) => saved.get(id),
    save: async (id, bytes) => void saved.set(id, bytes),
    delete: async (id) => void saved.delete(id),
  };
}

const order = (body = '{"sku":"book"}') => ({ method: "POST", headers: { "content-type": "application/json" }, body });
const lostSend = () => Promise.reject(Object.assign(new TypeError("fetch failed"), { cause: { code: "ECONNRESET" } }));

describe("idempotentFetch resuming a persisted entry", () => {
  test("with reconcile: false an undetermined entry is kept; the same id never sends under a new key (IDEM-CLIENT-4)", async () => {
    let losing = true;
    const { server, state } = await orderServer(() => losing);
    const persist = memory();
    const url = `${server.url}/orders`;
    try {
      const first = await idempotentFetch(url, order(), { id: "order-9", persist, retry: FAST, reconcile: false });
      assert.equal(first.outcome, "undetermined");
      assert.ok(persist.saved.has("order-9"), "kept for a later reconcile");
      losing = false;
      const requests = state.requests;
      const again = await idempotentFetch(url, order(), { id: "order-9", persist, retry: FAST, reconcile: false });
      assert.equal(again.outcome, "undetermined");
      assert.equal(again.key, first.key);
      assert.equal(state.requests, requests, "nothing sent under the id until it is reconciled");
      // Reconciled: it ran once, under the first key.
      const asked = await reconcile(url, order(), { id: "order-9", persist });
      assert.equal(asked.outcome, "executed");
      assert.equal(asked.status, 201);
      assert.equal(state.executions, 1);
      assert.deepEqual(new Set(state.keys), new Set([state.keys[0]]));
      assert.equal(persist.saved.has("order-9"), false);
    } finally {
      await server.close();
    }
  });

  test("an entry over but not yet deleted refuses another payload under its id and sends nothing (IDEM-CLIENT-1)", async () => {
    const { server, state } = await orderServer(() => false);
    const saved = new Map();
    let deletes = 0;
    // The process stops after the answer was saved and before the entry was deleted.
    const persist = {
      load: (id) => saved.get(id),
      save: (id, bytes) => void saved.set(id, bytes),
      delete: (id) => {
        if (++deletes === 1) throw new Error("process stopped");
        saved.delete(id);
      },
    };
    const url = `${server.url}/orders`;
    try {
      await assert.rejects(idempotentFetch(url, order('{"sku":"book"}'), { id: "cart", persist, retry: FAST }), /process stopped/);
      const requests = state.requests;
      await assert.rejects(
        idempotentFetch(url, order('{"sku":"piano"}'), { id: "cart", persist, retry: FAST }),
        (e) => e instanceof RangeError && e.code === "IDEM-CLIENT-1",
      );
      assert.equal(state.requests, requests);
      // The same payload is told what became of it.
      const same = await idempotentFetch(url, order('{"sku":"book"}'), { id: "cart", persist, retry: FAST });
      assert.equal(same.outcome, "completed");
      assert.equal(state.executions, 1);
    } finally {
      await server.close();
    }
  });

  test("an entry saved while waiting to ask again, met with reconcile: false, is undetermined and kept", async () => {
    const persist = memory();
    let sends = 0;
    const fetch = async (url, init) => {
      if (init.method === "GET") {
        return new Response(JSON.stringify({ status: "in-progress", retryAfter: 1 }), { status: 200, headers: { "content-type": STATUS_TYPE } });
      }
      sends++;
      return lostSend();
    };
    const closing = new AbortController();
    // The page closes while the call waits to ask about its key again.
    const first = idempotentFetch("http://127.0.0.1:9/orders", { ...order(), signal: closing.signal }, { fetch, id: "o1", persist, retry: { base: 5, cap: 10, maxAttempts: 1 } });
    setTimeout(() => closing.abort(new Error("page closed")), 200);
    await assert.rejects(first, /page closed/);
    assert.ok(persist.saved.has("o1"));
    const sent = sends;
    const again = await idempotentFetch("http://127.0.0.1:9/orders", order(), { fetch, id: "o1", persist, reconcile: false });
    assert.equal(again.outcome, "undetermined");
    assert.equal(sends, sent, "not sent again");
    assert.ok(persist.saved.has("o1"));
  });

  test("an order whose response was too large for the server to keep, its first answer lost, is executed, not rejected (IDEM-CLIENT-5, IDEM-STATUS-1, IDEM-STORE-5)", async () => {
    let executions = 0;
    let lose = true;
    const api = withIdempotency(
      async (request) => {
        executions++;
        await request.text();
        return new Response("x".repeat(5_000), { status: 201 });
      },
      { principal: "none", store: new MemoryStore(), maxResponseBytes: 1_024 },
    );
    const server = await serve(async (request, { res }) => {
      if (lose && request.method === "POST") {
        lose = false;
        await (await api(request)).arrayBuffer();
        res.socket.destroy();
        return null;
      }
      return api(request);
    });
    try {
      const done = await idempotentFetch(`${server.url}/orders`, order(), { retry: FAST });
      // The retry is answered 410 response-not-stored; the status query says it ran.
      assert.equal(done.outcome, "executed");
      assert.equal(executions, 1);
    } finally {
      await server.close();
    }
  });
});
