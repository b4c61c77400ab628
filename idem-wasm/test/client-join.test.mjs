// Calls of idempotentFetch with the same persist and id while one of them runs (IDEM-JS-9):
// one logical request, sent under one key, however the calls are released. Against a local
// server (127.0.0.1, OS-chosen port) in front of withIdempotency, whose handler is slow
// enough for the calls to overlap.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { setTimeout as delay } from "node:timers/promises";
import { MemoryStore, withIdempotency } from "idem";
import { idempotentFetch, reconcile } from "idem/client";
import { serve } from "./helpers.mjs";

const FAST = { base: 5, cap: 20, maxAttempts: 5, deadline: 5_000 };

/** An order API that takes `ms` to run an order, counting runs and the keys it was sent. */
async function orderServer(ms = 30) {
  const state = { executions: 0, keys: [], statusQueries: 0 };
  const api = withIdempotency(
    async (request) => {
      state.executions++;
      const order = await request.text();
      await delay(ms);
      return Response.json({ id: state.executions, order }, { status: 201 });
    },
    { principal: "none", store: new MemoryStore() },
  );
  const server = await serve((request) => {
    if (request.headers.has("idempotency-status")) state.statusQueries++;
    else state.keys.push(request.headers.get("idempotency-key"));
    return api(request);
  });
  return { server, state };
}

/** A persist store whose every operation awaits the event loop, as a real one would. */
function slowMemory() {
  const saved = new Map();
  return {
    saved,
    load: async (id) => (await delay(1), saved.get(id)),
    save: async (id, bytes) => (await delay(1), void saved.set(id, bytes)),
    delete: async (id) => (await delay(1), void saved.delete(id)),
  };
}

const order = (body = '{"sku":"book"}', init = {}) => ({ method: "POST", headers: { "content-type": "application/json" }, body, ...init });

describe("idempotentFetch calls sharing an id in one process (IDEM-JS-9)", () => {
  test("calls released together send one key, run once, and each reads the response", async () => {
    const { server, state } = await orderServer();
    const url = `${server.url}/orders`;
    try {
      for (let round = 0; round < 10; round++) {
        const persist = slowMemory();
        const executions = state.executions;
        const sent = state.keys.length;
        const results = await Promise.all(
          Array.from({ length: 4 }, () => idempotentFetch(url, order(), { id: `order-${round}`, persist, retry: FAST })),
        );
        assert.equal(state.executions, executions + 1, "the order ran once");
        assert.equal(state.keys.length, sent + 1, "one request was sent");
        const bodies = await Promise.all(results.map((r) => r.response.json()));
        for (const [i, r] of results.entries()) {
          assert.equal(r.outcome, "completed");
          assert.equal(r.key, results[0].key);
          assert.equal(r.status, 201);
          assert.deepEqual(bodies[i], { id: executions + 1, order: '{"sku":"book"}' });
        }
        assert.equal(persist.saved.size, 0);
      }
    } finally {
      await server.close();
    }
  });

  test("a call with another payload under the running id is refused and sends nothing", async () => {
    const { server, state } = await orderServer();
    const url = `${server.url}/orders`;
    const persist = slowMemory();
    try {
      const first = idempotentFetch(url, order(), { id: "order-a", persist, retry: FAST });
      const other = idempotentFetch(url, order('{"sku":"pen"}'), { id: "order-a", persist, retry: FAST });
      await assert.rejects(other, { code: "IDEM-CLIENT-1" });
      const done = await first;
      assert.equal(done.outcome, "completed");
      assert.equal(state.executions, 1);
      assert.deepEqual(state.keys, [`"${done.key}"`]);
    } finally {
      await server.close();
    }
  });

  test("a joining call whose signal aborts rejects alone; the running call completes", async () => {
    const { server, state } = await orderServer(60);
    const url = `${server.url}/orders`;
    const persist = slowMemory();
    try {
      const first = idempotentFetch(url, order(), { id: "order-b", persist, retry: FAST });
      const controller = new AbortController();
      const joining = idempotentFetch(url, order('{"sku":"book"}', { signal: controller.signal }), { id: "order-b", persist, retry: FAST });
      await delay(20);
      controller.abort(new Error("gave up"));
      await assert.rejects(joining, { message: "gave up" });
      const done = await first;
      assert.equal(done.outcome, "completed");
      assert.equal(await done.response.text(), '{"id":1,"order":"{\\"sku\\":\\"book\\"}"}');
      assert.equal(state.executions, 1);
    } finally {
      await server.close();
    }
  });

  test("when the running call aborts, a joining call goes on with its key and the order runs once", async () => {
    const { server, state } = await orderServer(60);
    const url = `${server.url}/orders`;
    const persist = slowMemory();
    try {
      const controller = new AbortController();
      const first = idempotentFetch(url, order('{"sku":"book"}', { signal: controller.signal }), { id: "order-c", persist, retry: FAST });
      const joining = idempotentFetch(url, order(), { id: "order-c", persist, retry: FAST });
      // Aborted while its request is in flight: the server runs the order all the same.
      while (state.keys.length === 0) await delay(2);
      controller.abort(new Error("left the page"));
      await assert.rejects(first, { message: "left the page" });
      const done = await joining;
      assert.equal(done.outcome, "completed");
      assert.equal(done.status, 201);
      assert.equal(state.executions, 1, "the order ran once");
      assert.deepEqual(new Set(state.keys), new Set([`"${done.key}"`]), "every send carried the first key");
      assert.equal(persist.saved.size, 0);
    } finally {
      await server.close();
    }
  });

  test("reconcile waits for the running call, and finds nothing left once it completed", async () => {
    const { server, state } = await orderServer();
    const url = `${server.url}/orders`;
    const persist = slowMemory();
    try {
      const first = idempotentFetch(url, order(), { id: "order-d", persist, retry: FAST });
      await delay(5);
      const asked = await reconcile(url, order(), { id: "order-d", persist });
      assert.equal(asked, null);
      assert.equal(state.statusQueries, 0, "no status query while the request ran");
      assert.equal((await first).outcome, "completed");
    } finally {
      await server.close();
    }
  });

  test("calls under different ids, or without persist, are requests of their own", async () => {
    const { server, state } = await orderServer();
    const url = `${server.url}/orders`;
    const persist = slowMemory();
    try {
      const results = await Promise.all([
        idempotentFetch(url, order(), { id: "order-e", persist, retry: FAST }),
        idempotentFetch(url, order(), { id: "order-f", persist, retry: FAST }),
        idempotentFetch(url, order(), { retry: FAST }),
      ]);
      assert.equal(new Set(results.map((r) => r.key)).size, 3);
      assert.equal(state.executions, 3);
    } finally {
      await server.close();
    }
  });
});
