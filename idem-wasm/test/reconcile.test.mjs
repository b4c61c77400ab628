// idempotentFetch and reconcile() asking the server what became of a key (IDEM-CLIENT-8),
// against a real server on 127.0.0.1 (withIdempotency on a MemoryStore, behind a front that
// loses what each test says): a lost answer past the budget reconciled to its replay, a
// request that never arrived settled so that its late copy is refused, an expired response,
// a key in progress asked about until it completes, a restart with the network cut for the
// first try, a payload that is gone, and a server that does not answer status queries.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { MemoryStore, withIdempotency } from "idem";
import { idempotentFetch, reconcile } from "idem/client";
import { deferred, manualClock, serve } from "./helpers.mjs";

const FAST = { base: 5, cap: 20, maxAttempts: 2, deadline: 10_000 };
const ORDER = { sku: "book", qty: 1 };

/**
 * The order API behind a front: `front(request, n)` says what the n-th request meets:
 * "pass", "drop-before" (the connection closes before the API sees it), "drop-after" (the
 * API runs, the answer is lost), "drop-now" (the connection closes while the API runs on),
 * or a promise of one of those. `options` go to
 * withIdempotency. Every request is logged as `METHOD status-field`.
 */
async function orderServer(front, options = {}) {
  const state = { executions: 0, log: [], late: [] };
  const gate = options.gate;
  const api = withIdempotency(
    async (request) => {
      // A GET that reaches the handler (a server without status queries) lists orders.
      if (request.method === "GET") return Response.json({ orders: state.executions });
      state.executions++;
      const order = await request.json();
      if (gate) await gate();
      return Response.json({ id: state.executions, ...order }, { status: 201 });
    },
    { principal: (request) => request.headers.get("x-user") ?? "", store: new MemoryStore(), ...options.idem },
  );
  const server = await serve(async (request, { res }) => {
    const n = state.log.length;
    state.log.push(`${request.method} ${request.headers.get("idempotency-status") ?? ""}`.trim());
    const fault = await front(request, n);
    if (fault === "drop-before") {
      // Kept, to be delivered late by the test.
      state.late.push(request.clone());
      res.socket.destroy();
      return null;
    }
    if (fault === "drop-now") {
      // The connection breaks at once; the handler goes on.
      state.running = api(request).then((r) => r.arrayBuffer());
      res.socket.destroy();
      return null;
    }
    if (fault === "drop-after") {
      await (await api(request)).arrayBuffer();
      res.socket.destroy();
      return null;
    }
    return api(request);
  });
  return { server, state, api };
}

const order = (body = ORDER) => ({
  method: "POST",
  headers: { "content-type": "application/json", "x-user": "alice" },
  body: JSON.stringify(body),
});

function memoryPersist() {
  const saved = new Map();
  return {
    saved,
    load: (id) => saved.get(id),
    save: (id, bytes) => void saved.set(id, bytes),
    delete: (id) => void saved.delete(id),
  };
}

const posts = (f) => (request, n) => (request.method === "POST" ? f(request, n) : "pass");

describe("idempotentFetch reconciles with a status query (IDEM-CLIENT-8)", () => {
  test("a lost answer past the budget: the server says completed, and the replay is fetched with the same key", async () => {
    let dropped = 0;
    const { server, state } = await orderServer(posts(() => (dropped++ < 2 ? "drop-after" : "pass")));
    try {
      const result = await idempotentFetch(`${server.url}/orders`, order(), { retry: FAST });
      assert.equal(result.outcome, "completed");
      assert.equal(result.status, 201);
      assert.equal(result.response.headers.get("idempotent-replayed"), "true");
      assert.deepEqual(await result.response.json(), { id: 1, ...ORDER });
      assert.deepEqual(state.log, ["POST", "POST", "GET POST; settle", "POST"]);
      assert.equal(state.executions, 1);
    } finally {
      await server.close();
    }
  });

  test("a request that never arrived is settled: not-executed, and its late copy is refused, never run", async () => {
    const { server, state, api } = await orderServer(posts(() => "drop-before"));
    try {
      const result = await idempotentFetch(`${server.url}/orders`, order(), { retry: FAST });
      assert.equal(result.outcome, "not-executed");
      assert.equal(result.attempts, 2);
      assert.equal(state.executions, 0);
      // The copies still travelling in the network arrive now.
      for (const late of state.late) {
        const answer = await api(late);
        assert.equal(answer.status, 409);
        assert.equal((await answer.json()).type, "urn:idem:problem:key-settled");
      }
      assert.equal(state.executions, 0, "never run");
    } finally {
      await server.close();
    }
  });

  test("a response gone from the server: executed, with no status and no response", async () => {
    const clock = manualClock();
    const { server, state } = await orderServer(
      posts(() => {
        // Each lost answer is older than the response retention by the time anyone asks.
        clock.advance(2_000);
        return "drop-after";
      }),
      { idem: { now: clock, responseTtl: 1_000, keyTtl: 60_000 } },
    );
    try {
      const result = await idempotentFetch(`${server.url}/orders`, order(), { retry: FAST });
      assert.equal(result.outcome, "executed");
      assert.equal(result.status, undefined);
      assert.equal(result.response, undefined);
      assert.equal(state.executions, 1);
    } finally {
      await server.close();
    }
  });

  test("a key in progress is asked about again after Retry-After, then its replay fetched", async () => {
    const running = deferred();
    const release = deferred();
    let first = true;
    const { server, state } = await orderServer(
      async (request) => {
        if (request.method !== "POST" || !first) return "pass";
        first = false;
        return "drop-now";
      },
      {
        gate: async () => {
          running.resolve();
          await release.promise;
        },
      },
    );
    try {
      const call = idempotentFetch(`${server.url}/orders`, order(), { retry: { ...FAST, maxAttempts: 1 } });
      await running.promise;
      // The first status query finds the key in progress; then the handler completes.
      setTimeout(() => release.resolve(), 300);
      const result = await call;
      assert.equal(result.outcome, "completed");
      assert.equal(state.executions, 1);
      assert.deepEqual(state.log, ["POST", "GET POST; settle", "GET POST; settle", "POST"]);
      await state.running;
    } finally {
      release.resolve();
      await server.close();
    }
  });

  test("a restart with the network cut: undetermined and kept; the next call asks, and completes", async () => {
    const { server, state } = await orderServer(() => "pass");
    const persist = memoryPersist();
    try {
      // The page closes while the order is in flight: it ran, the answer never came back.
      const crash = new AbortController();
      await assert.rejects(
        idempotentFetch(`${server.url}/orders`, { ...order(), signal: crash.signal }, {
          retry: FAST,
          id: "order-1",
          persist,
          fetch: async (url, init) => {
            await (await fetch(url, init)).arrayBuffer();
            crash.abort(new Error("page closed"));
            throw crash.signal.reason;
          },
        }),
        /page closed/,
      );
      // Reopened offline: nothing can be asked, and nothing is sent again.
      const offline = await idempotentFetch(`${server.url}/orders`, order(), {
        retry: FAST,
        id: "order-1",
        persist,
        fetch: async () => {
          throw new TypeError("fetch failed", { cause: { code: "ENETUNREACH" } });
        },
      });
      assert.equal(offline.outcome, "undetermined");
      assert.equal(offline.reason, "interrupted");
      assert.ok(persist.saved.has("order-1"), "kept to be asked about again");
      // Another payload under the same id is refused before anything goes out.
      const before = state.log.length;
      await assert.rejects(
        idempotentFetch(`${server.url}/orders`, order({ sku: "pen", qty: 3 }), { retry: FAST, id: "order-1", persist }),
        (e) => e.code === "IDEM-CLIENT-1",
      );
      assert.equal(state.log.length, before);
      // Back online.
      const online = await idempotentFetch(`${server.url}/orders`, order(), { retry: FAST, id: "order-1", persist });
      assert.equal(online.outcome, "completed");
      assert.equal(online.response.headers.get("idempotent-replayed"), "true");
      assert.equal(state.executions, 1);
      assert.equal(persist.saved.has("order-1"), false);
    } finally {
      await server.close();
    }
  });

  test("reconcile(): a persisted request whose payload is gone is told executed (with its status) or not-executed", async () => {
    const { server, state, api } = await orderServer(() => "pass");
    const persist = memoryPersist();
    const late = [];
    /** The page closes with the order in flight: it reached the server (`arrives`) or not
     * yet (then it is kept, to arrive late). */
    const closeWhileSending = (id, arrives, user = "alice") => {
      const crash = new AbortController();
      return assert.rejects(
        idempotentFetch(`${server.url}/orders`, { ...order(), headers: { ...order().headers, "x-user": user }, signal: crash.signal }, {
          id,
          persist,
          fetch: async (url, init) => {
            if (arrives) await (await fetch(url, init)).arrayBuffer();
            else late.push(new Request(url, init));
            crash.abort(new Error("page closed"));
            throw crash.signal.reason;
          },
        }),
        /page closed/,
      );
    };
    try {
      await closeWhileSending("ran", true);
      await closeWhileSending("lost", false);
      const headers = { "x-user": "alice" };
      const ran = await reconcile(`${server.url}/orders`, { method: "POST", headers }, { id: "ran", persist });
      assert.deepEqual([ran.outcome, ran.status], ["executed", 201]);
      const lost = await reconcile(`${server.url}/orders`, { method: "POST", headers }, { id: "lost", persist });
      assert.equal(lost.outcome, "not-executed");
      const answer = await api(late[0]);
      assert.equal(answer.status, 409, "the late copy is refused");
      assert.equal(state.executions, 1);
      assert.equal(persist.saved.size, 0);
      assert.equal(await reconcile(`${server.url}/orders`, { method: "POST", headers }, { id: "ran", persist }), null);
      // Asked as someone else, alice's key is unknown: the asker learns nothing of her order
      // (and settles the key in its own scope only).
      await closeWhileSending("ran-2", true);
      const other = await reconcile(`${server.url}/orders`, { method: "POST", headers: { "x-user": "mallory" } }, { id: "ran-2", persist });
      assert.equal(other.outcome, "not-executed");
      assert.equal(state.executions, 2);
    } finally {
      await server.close();
    }
  });

  test("a server that does not answer status queries leaves the outcome undetermined", async () => {
    const { server, state } = await orderServer(posts(() => "drop-after"), { idem: { statusQueries: false } });
    try {
      const result = await idempotentFetch(`${server.url}/orders`, order(), { retry: FAST });
      assert.equal(result.outcome, "undetermined");
      assert.equal(result.reason, "budget");
      assert.deepEqual(state.log, ["POST", "POST", "GET POST; settle"]);
      assert.equal(state.executions, 1);
    } finally {
      await server.close();
    }
  });

  test("a status document is parsed by the runtime and read as the core reads its text", async () => {
    const persist = memoryPersist();
    const url = "http://127.0.0.1:9/orders";
    /** What reconcile() makes of `document`, the answer to its status query, for an order
     * whose page closed while it was being sent. */
    const read = async (document) => {
      const crash = new AbortController();
      const sending = { method: "POST", headers: { "content-type": "application/json" }, body: "{}", signal: crash.signal };
      const closed = async () => {
        crash.abort(new Error("page closed"));
        throw crash.signal.reason;
      };
      await assert.rejects(idempotentFetch(url, sending, { id: "o", persist, fetch: closed }), /page closed/);
      const answer = async () => new Response(document, { headers: { "content-type": "application/vnd.idem.key-status+json" } });
      const result = await reconcile(url, { method: "POST" }, { id: "o", persist, fetch: answer });
      persist.saved.clear();
      return [result.outcome, result.status];
    };
    const completed = (status, more = "") => `{"status":"completed","response":{"status":${status},"replayable":false}${more}}`;
    assert.deepEqual(await read(completed(201)), ["executed", 201]);
    // Whitespace, escapes, members in any order, nested values off the path, and the last of
    // duplicate members, as in the core's reader.
    assert.deepEqual(await read(`{ "response" : { "replayable" : true , "x" : [ {} ] , "status" : 202 } ,\n "status" : "compl\\u0065ted" }`), ["executed", 202]);
    assert.deepEqual(await read(`{"status":"unknown","status":"completed","response":{"status":203,"replayable":false}}`), ["executed", 203]);
    assert.deepEqual(await read(`{"status":"not-executed"}`), ["not-executed", undefined]);
    assert.deepEqual(await read(`{"status":"expired"}`), ["executed", undefined]);
    // Not a status document: the outcome stays undetermined.
    for (const bad of [completed('"201"'), completed(99), `{"status":"completed"}`, `{"status":"Completed"}`, `{"status":7}`, `["status"]`, `{"status":"completed"`, ""]) {
      assert.deepEqual(await read(bad), ["undetermined", undefined], bad);
    }
  });

  test("bad options are refused (IDEM-JS-1)", async () => {
    await assert.rejects(idempotentFetch("http://127.0.0.1:9/x", {}, { reconcile: "yes" }), (e) => e.code === "IDEM-JS-1");
    await assert.rejects(reconcile("http://127.0.0.1:9/x", {}, {}), (e) => e.code === "IDEM-JS-1");
  });
});
