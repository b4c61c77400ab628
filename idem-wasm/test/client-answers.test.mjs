// idempotentFetch against answers that are not what they seem, over real HTTP to a local
// server (127.0.0.1, OS-chosen port) in front of withIdempotency: a final answer whose body
// breaks off, a handler's own 409, a refusal in front of the server after a lost answer,
// redirects, a status no HTTP answer has, and a non-final answer that never ends.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { MemoryStore, withIdempotency } from "idem";
import { idempotentFetch } from "idem/client";
import { serve } from "./helpers.mjs";

const FAST = { base: 5, cap: 40, maxAttempts: 6, deadline: 10_000 };

const order = (body = { sku: "book", qty: 1 }) => ({
  method: "POST",
  headers: { "content-type": "application/json" },
  body: JSON.stringify(body),
});

/** A persist in memory. */
function memoryPersist() {
  const saved = new Map();
  return {
    saved,
    load: async (id) => saved.get(id) ?? null,
    save: async (id, bytes) => void saved.set(id, bytes),
    delete: async (id) => void saved.delete(id),
  };
}

/** The order API (`answer(state, order)` makes the handler's answer), behind `front(request,
 * n, api, res)`, which decides what the n-th request meets (`undefined`: the API answers). */
async function orders(front, answer = (state, body) => Response.json({ id: state.executions, ...body, pad: "p".repeat(20_000) }, { status: 201 })) {
  const state = { executions: 0, requests: 0, keys: [] };
  const api = withIdempotency(
    async (request) => {
      state.executions++;
      return answer(state, await request.json());
    },
    { principal: "none", store: new MemoryStore() },
  );
  const server = await serve(async (request, { res }) => {
    const n = state.requests++;
    state.keys.push(request.headers.get("idempotency-key"));
    // null: the front answered (or dropped) the connection itself.
    const own = await front(request, n, api, res);
    return own === undefined ? api(request) : own;
  });
  return { server, state };
}

describe("idempotentFetch and the answers it gets", () => {
  test("a final answer whose body breaks off is an answer lost: the same key fetches its replay, whole (IDEM-CLIENT-2)", async () => {
    const { server, state } = await orders(async (request, n, api, res) => {
      if (n > 0) return undefined;
      const response = await api(request);
      const body = Buffer.from(await response.arrayBuffer());
      res.writeHead(response.status, { "content-type": "application/json", "content-length": body.length });
      res.write(body.subarray(0, 1_000));
      setTimeout(() => res.socket.destroy(), 20);
      return null;
    });
    try {
      const persist = memoryPersist();
      const done = await idempotentFetch(`${server.url}/orders`, order(), { id: "o1", persist, retry: FAST });
      assert.equal(done.outcome, "completed");
      assert.equal(done.attempts, 2);
      const body = await done.response.json();
      assert.equal(body.id, 1);
      assert.equal(done.response.headers.get("idempotent-replayed"), "true");
      assert.equal(state.executions, 1);
      assert.equal(new Set(state.keys).size, 1, "one key");
      assert.equal(persist.saved.size, 0, "over once the answer arrived");
    } finally {
      await server.close();
    }
  });

  test("a handler's own 409, replayed, is its outcome: rejected at once, run once (IDEM-CLIENT-2)", async () => {
    const { server, state } = await orders(
      () => undefined,
      () => Response.json({ error: "this order number is taken" }, { status: 409 }),
    );
    try {
      const done = await idempotentFetch(`${server.url}/orders`, order(), { retry: { ...FAST, base: 50, cap: 50 } });
      assert.equal(done.outcome, "rejected");
      assert.equal(done.status, 409);
      assert.deepEqual(await done.response.json(), { error: "this order number is taken" });
      // The first 409 may be a key in use (the draft's 409): sent again, and its replay ends it.
      assert.equal(state.requests, 2);
      assert.equal(state.executions, 1);
    } finally {
      await server.close();
    }
  });

  test("a refusal in front of the server after a lost answer is undetermined, and the same id later gets the replay (IDEM-CLIENT-5)", async () => {
    let expired = false;
    const { server, state } = await orders(async (request, n, api, res) => {
      if (n === 0) {
        // It runs; its answer is lost, and the credential expires meanwhile.
        await (await api(request)).arrayBuffer();
        expired = true;
        res.socket.destroy();
        return null;
      }
      if (expired) return Response.json({ error: "token expired" }, { status: 401 });
      return undefined;
    });
    try {
      const persist = memoryPersist();
      const first = await idempotentFetch(`${server.url}/orders`, order(), { id: "o3", persist, retry: FAST });
      assert.equal(first.outcome, "undetermined");
      assert.equal(first.reason, "refused");
      assert.equal(first.status, 401);
      assert.ok(persist.saved.has("o3"), "the entry is kept under its id");
      expired = false;
      const again = await idempotentFetch(`${server.url}/orders`, order(), { id: "o3", persist, retry: FAST });
      assert.equal(again.outcome, "completed");
      assert.equal(again.key, first.key);
      assert.equal((await again.response.json()).id, 1);
      assert.equal(state.executions, 1);
      assert.equal(persist.saved.size, 0);
    } finally {
      await server.close();
    }
  });

  for (const status of [307, 308]) {
    test(`a ${status} redirect is followed with the body and the key (IDEM-CLIENT-3)`, async () => {
      const { server, state } = await orders(async (request) =>
        new URL(request.url).pathname === "/old" ? new Response(null, { status, headers: { location: "/orders" } }) : undefined,
      );
      try {
        const done = await idempotentFetch(`${server.url}/old`, order(), { retry: FAST });
        assert.equal(done.outcome, "completed");
        assert.equal(done.attempts, 1);
        assert.equal((await done.response.json()).sku, "book");
        assert.equal(state.executions, 1);
        assert.equal(state.keys[0], state.keys[1], "the key went with the redirect");
      } finally {
        await server.close();
      }
    });
  }

  test("a status no HTTP answer has is no answer: sent again under the same key, its entry still readable (IDEM-CLIENT-2)", async () => {
    const { server, state } = await orders(async (request, n, api, res) => {
      if (n > 0) return undefined;
      await (await api(request)).arrayBuffer();
      res.writeHead(600, { "content-type": "text/plain" });
      res.end("?");
      return null;
    });
    try {
      const persist = memoryPersist();
      const done = await idempotentFetch(`${server.url}/orders`, order(), { id: "o5", persist, retry: FAST });
      assert.equal(done.outcome, "completed");
      assert.equal(done.response.headers.get("idempotent-replayed"), "true");
      assert.equal(state.executions, 1);
      assert.equal(new Set(state.keys).size, 1);
    } finally {
      await server.close();
    }
  });

  test("a 503 whose body never ends holds nothing up: the next attempt goes out", async () => {
    const { server, state } = await orders(async (request, n, api, res) => {
      if (n > 0) return undefined;
      res.writeHead(503, { "content-type": "text/plain" });
      res.write("still failing ");
      return null;
    });
    try {
      const done = await idempotentFetch(`${server.url}/orders`, order(), { retry: FAST });
      assert.equal(done.outcome, "completed");
      assert.equal(done.attempts, 2);
      assert.equal(state.executions, 1);
    } finally {
      await server.close();
    }
  });
});
