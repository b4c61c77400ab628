// idempotentFetch against a local server (127.0.0.1, OS-chosen port) that loses responses,
// answers 5xx and asks to retry later, in front of withIdempotency with a memory store.
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { describe, test } from "node:test";
import { MemoryStore, withIdempotency } from "idem";
import { idempotentFetch } from "idem/client";
import { serve } from "./helpers.mjs";

const FAST = { base: 5, cap: 40, maxAttempts: 8, deadline: 10_000 };

/** An order API behind a faulty front: `faults[n]` decides what the n-th request meets. */
async function faultyServer(faults) {
  const state = { executions: 0, keys: [], requests: 0 };
  const api = withIdempotency(
    async (request) => {
      state.executions++;
      const order = await request.json();
      return Response.json({ id: state.executions, ...order }, { status: 201 });
    },
    { principal: "none", store: new MemoryStore(), keyKind: "uuid" },
  );
  const server = await serve(async (request, { res }) => {
    const n = state.requests++;
    state.keys.push(request.headers.get("idempotency-key"));
    const fault = faults[n] ?? faults.rest ?? "pass";
    if (fault === "drop-before") {
      res.socket.destroy();
      return null;
    }
    if (fault === "drop-after") {
      await (await api(request)).arrayBuffer();
      res.socket.destroy(); // executed, but the response is lost
      return null;
    }
    if (fault === "503") return new Response("upstream unavailable", { status: 503 });
    if (fault === "429") return new Response("slow down", { status: 429, headers: { "retry-after": "1" } });
    return api(request);
  });
  return { server, state };
}

const order = (body = { sku: "book", qty: 1 }) => ({
  method: "POST",
  headers: { "content-type": "application/json" },
  body: JSON.stringify(body),
});

describe("idempotentFetch", () => {
  test("lost responses and 5xx end with exactly one execution and the stored response (IDEM-CLIENT-2, IDEM-CLIENT-3)", async () => {
    const { server, state } = await faultyServer(["drop-after", "503", "drop-before", "pass"]);
    try {
      const result = await idempotentFetch(`${server.url}/orders`, order(), { retry: FAST });
      assert.equal(result.outcome, "completed");
      assert.equal(result.status, 201);
      assert.equal(result.attempts, 4);
      assert.equal(result.response.headers.get("idempotent-replayed"), "true");
      assert.deepEqual(await result.response.json(), { id: 1, sku: "book", qty: 1 });
      assert.equal(state.executions, 1);
      // One key for every retry, sent as an sf-string, a UUID v4.
      assert.equal(new Set(state.keys).size, 1);
      assert.match(state.keys[0], /^"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"$/);
      assert.equal(result.key, state.keys[0].slice(1, -1));
    } finally {
      await server.close();
    }
  });

  test("repeated runs against random faults never execute twice", async () => {
    const kinds = ["drop-after", "drop-before", "503", "pass"];
    for (let run = 0; run < 10; run++) {
      const faults = Array.from({ length: 4 }, (_, i) => kinds[(run * 7 + i * 3) % kinds.length]);
      const { server, state } = await faultyServer(faults);
      try {
        const result = await idempotentFetch(`${server.url}/orders`, order({ run }), { retry: FAST, keyVersion: 7 });
        assert.equal(result.outcome, "completed", `faults ${faults}`);
        assert.equal(state.executions, 1, `faults ${faults}`);
        assert.equal(new Set(state.keys).size, 1);
        assert.match(result.key, /^[0-9a-f]{8}-[0-9a-f]{4}-7/);
      } finally {
        await server.close();
      }
    }
  });

  test("a server that keeps losing responses leaves the outcome undetermined, never failed (IDEM-CLIENT-4)", async () => {
    const { server, state } = await faultyServer({ rest: "drop-after" });
    try {
      const result = await idempotentFetch(`${server.url}/orders`, order(), { retry: { ...FAST, maxAttempts: 3 } });
      assert.equal(result.outcome, "undetermined");
      assert.equal(result.reason, "budget");
      assert.equal(result.attempts, 3);
      assert.equal(state.executions, 1);
    } finally {
      await server.close();
    }
  });

  test("a refused connection sends nothing: the outcome is failed", async () => {
    const probe = createServer();
    await new Promise((resolve) => probe.listen(0, "127.0.0.1", resolve));
    const { port } = probe.address();
    await new Promise((resolve) => probe.close(resolve));
    const result = await idempotentFetch(`http://127.0.0.1:${port}/orders`, order(), { retry: { ...FAST, maxAttempts: 2 } });
    assert.equal(result.outcome, "failed");
    assert.equal(result.reason, "budget");
  });

  test("a deterministic 4xx is rejected without retrying", async () => {
    const { server, state } = await faultyServer([]);
    try {
      const result = await idempotentFetch(`${server.url}/orders`, { ...order(), body: "{broken" }, { retry: FAST });
      assert.equal(result.outcome, "rejected");
      assert.equal(result.status, 400);
      assert.equal(result.attempts, 1);
      assert.equal(state.executions, 0);
    } finally {
      await server.close();
    }
  });

  test("Retry-After is honoured (IDEM-CLIENT-3)", async () => {
    const { server, state } = await faultyServer(["429", "pass"]);
    try {
      const started = Date.now();
      const result = await idempotentFetch(`${server.url}/orders`, order(), { retry: FAST });
      assert.equal(result.outcome, "completed");
      assert.ok(Date.now() - started >= 1000, "waited at least Retry-After");
      assert.equal(state.executions, 1);
    } finally {
      await server.close();
    }
  });

  test("a restart resumes with the persisted key, and a changed payload is refused (IDEM-CLIENT-1, IDEM-CLIENT-6)", async () => {
    const { server, state } = await faultyServer([]);
    const saved = new Map();
    const persist = {
      load: (id) => saved.get(id),
      save: (id, bytes) => void saved.set(id, bytes),
      delete: (id) => void saved.delete(id),
    };
    try {
      // The "process" stops while the first send is in flight: the entry was saved as sent.
      const crash = new AbortController();
      let firstKey;
      await assert.rejects(
        idempotentFetch(`${server.url}/orders`, { ...order(), signal: crash.signal }, {
          retry: FAST,
          id: "order-7",
          persist,
          fetch: async (url, init) => {
            firstKey = init.headers.get("idempotency-key");
            const response = await fetch(url, init); // it reaches the server and runs
            await response.arrayBuffer();
            crash.abort(new Error("process stopped"));
            throw crash.signal.reason;
          },
        }),
        /process stopped/,
      );
      assert.ok(saved.has("order-7"));
      assert.equal(state.executions, 1);

      const sentBefore = state.requests;
      await assert.rejects(
        idempotentFetch(`${server.url}/orders`, order({ sku: "other", qty: 9 }), { retry: FAST, id: "order-7", persist }),
        (e) => e instanceof RangeError && e.code === "IDEM-CLIENT-1",
      );

      assert.equal(state.requests, sentBefore, "a changed payload sends nothing, not even a status query");

      // Resumed: it asks what became of the key (IDEM-CLIENT-8), then fetches the replay.
      const resumed = await idempotentFetch(`${server.url}/orders`, order(), { retry: FAST, id: "order-7", persist });
      assert.equal(resumed.outcome, "completed");
      assert.equal(resumed.response.headers.get("idempotent-replayed"), "true");
      assert.deepEqual(state.keys.slice(-2), [firstKey, firstKey]);
      assert.equal(state.requests, sentBefore + 2);
      assert.equal(state.executions, 1);
      assert.equal(saved.has("order-7"), false, "a finished entry is deleted");

      saved.set("order-8", new Uint8Array([1, 2, 3]));
      await assert.rejects(
        idempotentFetch(`${server.url}/orders`, order(), { id: "order-8", persist }),
        (e) => e instanceof RangeError && e.code === "IDEM-CLIENT-6",
      );
    } finally {
      await server.close();
    }
  });

  test("bad options are refused (IDEM-JS-1)", async () => {
    await assert.rejects(idempotentFetch("http://127.0.0.1:9/x", {}, { keyVersion: 5 }), (e) => e.code === "IDEM-JS-1");
    await assert.rejects(idempotentFetch("http://127.0.0.1:9/x", {}, { retry: { base: 0 } }), (e) => e.code === "IDEM-JS-1");
    await assert.rejects(idempotentFetch("http://127.0.0.1:9/x", {}, { persist: {} }), (e) => e.code === "IDEM-JS-1");
    // The signal is fetch's own, in init (IDEM-JS-8): one given beside it would not be the one obeyed.
    await assert.rejects(idempotentFetch("http://127.0.0.1:9/x", {}, { signal: AbortSignal.abort() }), (e) => e.code === "IDEM-JS-1");
  });
});
