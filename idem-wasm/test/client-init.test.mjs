// idempotentFetch and the fetch options it is given, against a local server (127.0.0.1,
// OS-chosen port) in front of withIdempotency: every attempt is sent with all of the caller's
// options, and `init.signal` stops the retries at once (IDEM-JS-8).
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { describe, test } from "node:test";
import { MemoryStore, withIdempotency } from "idem";
import { idempotentFetch } from "idem/client";
import { serve } from "./helpers.mjs";

const FAST = { base: 5, cap: 40, maxAttempts: 8, deadline: 10_000 };
const BODY = { sku: "book", qty: 1 };
const delay = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** An order API whose n-th request meets `faults[n]` (else `faults.rest`, else nothing):
 * `503`, `429` (Retry-After: 5), `hold` (answered after 3 s), or `({ n })` run first. */
async function orderServer(faults = []) {
  const state = { executions: 0, requests: 0, keys: [] };
  const api = withIdempotency(
    async (request) => {
      state.executions++;
      return Response.json({ id: state.executions, ...(await request.json()) }, { status: 201 });
    },
    { principal: "none", store: new MemoryStore() },
  );
  const server = await serve(async (request) => {
    const n = state.requests++;
    state.keys.push(request.headers.get("idempotency-key"));
    const fault = faults[n] ?? faults.rest;
    if (typeof fault === "function") fault({ n });
    if (fault === "503") return new Response("upstream unavailable", { status: 503 });
    if (fault === "429") return new Response("slow down", { status: 429, headers: { "retry-after": "5" } });
    if (fault === "hold") await delay(3_000);
    return api(request);
  });
  return { server, state };
}

const order = (extra = {}) => ({ method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(BODY), ...extra });

/** The real fetch, recording the options of every attempt. */
function recordingFetch() {
  const seen = [];
  const f = (url, init) => {
    seen.push(init);
    return fetch(url, init);
  };
  return { seen, fetch: f };
}

describe("idempotentFetch passes the caller's fetch options on (IDEM-JS-8)", () => {
  test("every attempt is sent with every option of init, standard or not", async () => {
    const { server, state } = await orderServer(["503"]);
    try {
      const rec = recordingFetch();
      const options = { credentials: "include", mode: "cors", keepalive: true, cache: "no-store", referrerPolicy: "no-referrer", priority: "high" };
      const runtimeOwn = { hops: 2 }; // what a runtime adds to RequestInit (workerd's `cf`, undici's `dispatcher` …)
      const result = await idempotentFetch(`${server.url}/orders`, order({ ...options, cf: runtimeOwn }), { retry: FAST, fetch: rec.fetch });
      assert.equal(result.outcome, "completed");
      assert.equal(state.executions, 1);
      assert.equal(rec.seen.length, 2);
      for (const init of rec.seen) {
        for (const [name, value] of Object.entries(options)) assert.equal(init[name], value, name);
        assert.equal(init.cf, runtimeOwn);
      }
    } finally {
      await server.close();
    }
  });

  test("the options of an input Request are sent too", async () => {
    const { server } = await orderServer();
    try {
      const rec = recordingFetch();
      const input = new Request(`${server.url}/orders`, order({ credentials: "include", mode: "same-origin", keepalive: true, redirect: "manual" }));
      const result = await idempotentFetch(input, {}, { retry: FAST, fetch: rec.fetch });
      assert.equal(result.outcome, "completed");
      assert.deepEqual(await result.response.json(), { id: 1, ...BODY });
      const [init] = rec.seen;
      assert.deepEqual([init.credentials, init.mode, init.keepalive, init.redirect], ["include", "same-origin", true, "manual"]);
    } finally {
      await server.close();
    }
  });

  test("the runtime's fetch applies them: a response that fails init.integrity is not taken as completed", async () => {
    const { server, state } = await orderServer();
    try {
      const digest = (text) => `sha256-${createHash("sha256").update(text).digest("base64")}`;
      const good = await idempotentFetch(`${server.url}/orders`, order({ integrity: digest(JSON.stringify({ id: 1, ...BODY })) }), { retry: FAST });
      assert.equal(good.outcome, "completed");
      const bad = await idempotentFetch(`${server.url}/orders`, order({ integrity: digest("something else") }), { retry: { ...FAST, maxAttempts: 2 } });
      // Sent and run, but the answer failed the check every time: it may have been processed.
      assert.equal(bad.outcome, "undetermined");
      assert.equal(state.executions, 2);
    } finally {
      await server.close();
    }
  });
});

describe("idempotentFetch stops when init.signal aborts (IDEM-JS-8)", () => {
  test("an abort mid-backoff rejects at once with the signal's reason; a persisted entry resumes with its key", async () => {
    const abort = new AbortController();
    // The first answer asks for 5 s of patience; the caller gives up 100 ms into it.
    const { server, state } = await orderServer(["429"]);
    const saved = new Map();
    const persist = { load: (id) => saved.get(id), save: (id, bytes) => void saved.set(id, bytes), delete: (id) => void saved.delete(id) };
    try {
      const started = Date.now();
      const call = idempotentFetch(`${server.url}/orders`, order({ signal: abort.signal }), { retry: FAST, id: "order-1", persist });
      while (state.requests === 0) await delay(5);
      await delay(100);
      abort.abort();
      await assert.rejects(call, (e) => e.name === "AbortError");
      assert.ok(Date.now() - started < 2_000, `stopped after ${Date.now() - started} ms`);
      await delay(100);
      assert.equal(state.requests, 1, "nothing sent after the abort");
      // The entry is kept: the same logical request goes on later with the same key.
      assert.ok(saved.has("order-1"));
      // (Later: past the 5 s the server asked for.)
      const later = () => Date.now() + 6_000;
      const resumed = await idempotentFetch(`${server.url}/orders`, order(), { retry: FAST, id: "order-1", persist, now: later });
      assert.equal(resumed.outcome, "completed");
      assert.equal(state.keys[1], state.keys[0]);
      assert.equal(state.executions, 1);
    } finally {
      await server.close();
    }
  });

  test("an abort while a send is in flight rejects at once; an aborted signal sends nothing", async () => {
    const { server, state } = await orderServer({ rest: "hold" });
    try {
      const started = Date.now();
      const reason = new Error("the user left the page");
      const abort = new AbortController();
      setTimeout(() => abort.abort(reason), 100);
      await assert.rejects(idempotentFetch(`${server.url}/orders`, order({ signal: abort.signal }), { retry: FAST }), (e) => e === reason);
      assert.ok(Date.now() - started < 2_000, `stopped after ${Date.now() - started} ms`);
      assert.equal(state.requests, 1);

      await assert.rejects(idempotentFetch(`${server.url}/orders`, order({ signal: AbortSignal.abort() }), { retry: FAST }), (e) => e.name === "AbortError");
      assert.equal(state.requests, 1, "nothing sent");
    } finally {
      await server.close();
    }
  });
});

describe("idempotentFetch sends its key, and only its own", () => {
  test("a request with an Idempotency-Key of its own is refused before anything is sent (IDEM-JS-1)", async () => {
    const { server, state } = await orderServer();
    try {
      const init = order({ headers: { "content-type": "application/json", "idempotency-key": '"my-order-42"' } });
      await assert.rejects(idempotentFetch(`${server.url}/orders`, init, { retry: FAST }), (e) => e instanceof RangeError && e.code === "IDEM-JS-1" && /options\.key/.test(e.message));
      assert.equal(state.requests, 0);
    } finally {
      await server.close();
    }
  });

  test("a key with quotes and backslashes goes out as an escaped sf-string, the same on every retry (IDEM-KEY-2)", async () => {
    const { server, state } = await orderServer(["503"]);
    try {
      const key = 'order "42" C:\\orders\\42';
      const result = await idempotentFetch(`${server.url}/orders`, order(), { key, retry: FAST });
      assert.equal(result.outcome, "completed");
      assert.equal(result.response.status, 201);
      assert.deepEqual(state.keys, ['"order \\"42\\" C:\\\\orders\\\\42"', '"order \\"42\\" C:\\\\orders\\\\42"']);
      assert.equal(state.executions, 1);
    } finally {
      await server.close();
    }
  });

  test("a wait longer than a timer can hold is not a stream of timers; one longer than the deadline is not waited for (IDEM-CLIENT-4)", async () => {
    // The server keeps answering that the key is in progress, to be asked again in 30 days.
    const fetch = async (url, init) => {
      if (init.method === "GET") {
        const status = JSON.stringify({ status: "in-progress", retryAfter: 30 * 86_400 });
        return new Response(status, { status: 200, headers: { "content-type": "application/vnd.idem.key-status+json" } });
      }
      throw Object.assign(new TypeError("fetch failed"), { cause: { code: "ECONNRESET" } });
    };
    const real = globalThis.setTimeout;
    const delays = [];
    globalThis.setTimeout = (f, ms, ...rest) => {
      delays.push(ms);
      return real(f, ms, ...rest);
    };
    const stop = new AbortController();
    try {
      // A deadline longer than the wait, which is then waited for.
      const retry = { base: 5, cap: 10, maxAttempts: 1, deadline: 40 * 86_400_000 };
      const call = idempotentFetch("http://127.0.0.1:9/orders", order({ signal: stop.signal }), { fetch, retry });
      await new Promise((resolve) => real(resolve, 500));
      stop.abort(new Error("stopped"));
      await assert.rejects(call, /stopped/);
    } finally {
      globalThis.setTimeout = real;
    }
    assert.ok(delays.every((ms) => ms <= 2 ** 31 - 1), `delays: ${delays.slice(0, 5)}`);
    assert.ok(delays.length < 10, `${delays.length} timers in 500 ms`);
    // With the default deadline (10 minutes) the 30 days are not waited for.
    const result = await idempotentFetch("http://127.0.0.1:9/orders", order(), { fetch, retry: { base: 5, cap: 10, maxAttempts: 1 } });
    assert.equal(result.outcome, "undetermined");
  });
});
