// withIdempotency against the built package (resolved through package.json "exports").
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { describe, test } from "node:test";
import { Idempotency, MemoryStore, StoreFullError, idempotencyOf, withIdempotency } from "idem";
import { barrier, deferred, manualClock, serve, tick } from "./helpers.mjs";

const URL_ORDERS = "http://127.0.0.1/orders";

function post(body, key = '"order-1"', extra = {}) {
  const headers = { "content-type": "application/json", ...extra };
  if (key !== null) headers["idempotency-key"] = key;
  return new Request(URL_ORDERS, { method: "POST", headers, body: typeof body === "string" ? body : JSON.stringify(body) });
}

/** An order API whose side effect is a counter. */
function orders(options = {}) {
  const state = { executions: 0, events: [] };
  const handler = withIdempotency(
    async (request) => {
      state.executions++;
      const input = await request.json();
      if (options.gate) await options.gate(request);
      const status = input.fail ?? 201;
      return new Response(JSON.stringify({ order: state.executions, input }), {
        status,
        headers: { "content-type": "application/json", "x-order": String(state.executions) },
      });
    },
    {
      // The caller, as the host's own authentication would state it (a user id, not a token).
      principal: (request) => request.headers.get("x-user") ?? "user-1",
      store: options.store ?? new MemoryStore(),
      onEvent: (e) => state.events.push(e),
      ...options.idem,
    },
  );
  return { handler, state };
}

async function problem(response) {
  assert.equal(response.headers.get("content-type"), "application/problem+json");
  return response.json();
}

describe("replay", () => {
  test("a retry gets the stored response byte for byte with Idempotent-Replayed (IDEM-REPLAY-1, IDEM-REPLAY-2)", async () => {
    const { handler, state } = orders();
    const first = await handler(post({ sku: "a", qty: 2 }));
    assert.equal(first.status, 201);
    assert.equal(first.headers.get("idempotent-replayed"), null);
    const firstBody = new Uint8Array(await first.arrayBuffer());
    for (let i = 0; i < 3; i++) {
      const again = await handler(post({ qty: 2, sku: "a" })); // reordered members: same JSON (IDEM-FP-3)
      assert.equal(again.status, 201);
      assert.equal(again.headers.get("idempotent-replayed"), "true");
      assert.equal(again.headers.get("x-order"), "1");
      assert.equal(again.headers.get("content-type"), "application/json");
      assert.deepEqual(new Uint8Array(await again.arrayBuffer()), firstBody);
    }
    assert.equal(state.executions, 1);
    assert.deepEqual(
      state.events.map((e) => e.name),
      ["executed", "completed", "replayed", "replayed", "replayed"],
    );
  });

  test("a deterministic 4xx is stored and replayed; a 5xx is not (IDEM-REPLAY-3, IDEM-OUT-4)", async () => {
    const { handler, state } = orders();
    assert.equal((await handler(post({ fail: 404 }, '"k4"'))).status, 404);
    const replay = await handler(post({ fail: 404 }, '"k4"'));
    assert.equal(replay.status, 404);
    assert.equal(replay.headers.get("idempotent-replayed"), "true");
    assert.equal(state.executions, 1);

    assert.equal((await handler(post({ fail: 503 }, '"k5"'))).status, 503);
    const retry = await handler(post({ fail: 503 }, '"k5"'));
    assert.equal(retry.headers.get("idempotent-replayed"), null);
    assert.equal(state.executions, 3);
    assert.ok(state.events.some((e) => e.name === "took-over"));
  });

  test("a 429 releases the key: the next request executes as new (IDEM-OUT-2)", async () => {
    const { handler, state } = orders();
    assert.equal((await handler(post({ fail: 429 }))).status, 429);
    assert.ok(state.events.some((e) => e.name === "released"));
    assert.equal((await handler(post({ fail: 429 }))).status, 429);
    assert.equal(state.executions, 2);
  });

  test("keys are scoped by principal, method and route (IDEM-SCOPE-1, IDEM-SCOPE-2)", async () => {
    const { handler, state } = orders();
    const alice = await handler(post({ a: 1 }, '"shared"', { "x-user": "alice" }));
    const bob = await handler(post({ a: 1 }, '"shared"', { "x-user": "bob" }));
    assert.equal(alice.headers.get("x-order"), "1");
    assert.equal(bob.headers.get("x-order"), "2");
    assert.equal(bob.headers.get("idempotent-replayed"), null);
    const aliceAgain = await handler(post({ a: 1 }, '"shared"', { "x-user": "alice" }));
    assert.equal(aliceAgain.headers.get("x-order"), "1");
    assert.equal(state.executions, 2);
  });

  test("unguarded methods and keyless requests with optional keys pass through", async () => {
    const { handler, state } = orders({ idem: { keys: "optional" } });
    assert.equal((await handler(post({ a: 1 }, null))).status, 201);
    assert.equal((await handler(post({ a: 1 }, null))).status, 201);
    assert.equal(state.executions, 2);
    const get = withIdempotency(() => new Response("listing"), { principal: "none", store: new MemoryStore() });
    assert.equal(await (await get(new Request(URL_ORDERS))).text(), "listing");
  });

  test("the handler reads the body and its idempotency context", async () => {
    let seen;
    const handler = withIdempotency(
      async (request) => {
        seen = { body: await request.text(), ctx: idempotencyOf(request) };
        return new Response("ok");
      },
      { principal: "none", store: new MemoryStore() },
    );
    await handler(post({ x: 1 }, "bare-key-1"));
    assert.equal(seen.body, '{"x":1}');
    assert.equal(seen.ctx.key, "bare-key-1");
    assert.equal(seen.ctx.recovered, false);
    assert.equal(seen.ctx.fence, 1);
    // The handler's data, and nothing else, is enumerable; extend works detached.
    assert.deepEqual(Object.keys(seen.ctx), ["key", "recovered", "fence", "leaseExpires", "extend"]);
    assert.equal(typeof seen.ctx.finish, "function");
    // After the request, the storage key is refused (IDEM-LEASE-3).
    assert.throws(() => seen.ctx.storageKey, (e) => e.code === "IDEM-LEASE-3");
    const { extend } = seen.ctx;
    await assert.rejects(extend(), (e) => e.code === "IDEM-LEASE-3");
  });
});

describe("responses the context builds (IDEM-JS-5)", () => {
  /** withIdempotency over `build(context, request)`, counting runs and keeping what the
   * handler returned. */
  function built(build) {
    const state = { executions: 0, returned: [] };
    const handler = withIdempotency(
      async (request) => {
        state.executions++;
        await request.text();
        const response = await build(idempotencyOf(request), request);
        state.returned.push(response);
        return response;
      },
      { principal: "none", store: new MemoryStore() },
    );
    return { handler, state };
  }

  test("the caller gets the handler's own response, its body unread, and a retry the same bytes", async () => {
    const { handler, state } = built((context) => context.respond("café ✓", { status: 201, headers: { "x-order": "1" } }));
    const first = await handler(post({ a: 1 }));
    assert.equal(first, state.returned[0], "the same Response object");
    assert.equal(first.bodyUsed, false);
    assert.equal(first.status, 201);
    // The body's own content type, as `new Response(text)` gives it.
    assert.equal(first.headers.get("content-type"), new Response("x").headers.get("content-type"));
    assert.equal(await first.text(), "café ✓");
    const replay = await handler(post({ a: 1 }));
    assert.equal(replay.headers.get("idempotent-replayed"), "true");
    assert.equal(replay.headers.get("x-order"), "1");
    assert.equal(await replay.text(), "café ✓");
    assert.equal(state.executions, 1);
  });

  test("json: application/json unless the handler names a type, and a value with no JSON form is refused", async () => {
    const { handler } = built((context, request) =>
      new URL(request.url).search === "?typed"
        ? context.json({ id: 7 }, { status: 201, headers: { "content-type": "application/vnd.order+json" } })
        : context.json({ id: 7, items: [1, 2] }, { status: 201 }),
    );
    const plain = await handler(post({ a: 1 }, '"j1"'));
    assert.equal(plain.headers.get("content-type"), "application/json");
    assert.deepEqual(await plain.json(), { id: 7, items: [1, 2] });
    const replay = await handler(post({ a: 1 }, '"j1"'));
    assert.equal(replay.headers.get("content-type"), "application/json");
    assert.deepEqual(await replay.json(), { id: 7, items: [1, 2] });
    const typed = await handler(new Request(`${URL_ORDERS}?typed`, { method: "POST", headers: { "idempotency-key": '"j2"' }, body: "{}" }));
    assert.equal(typed.headers.get("content-type"), "application/vnd.order+json");
    const { handler: none } = built((context) => context.json(undefined));
    await assert.rejects(none(post({ a: 1 }, '"j3"')), TypeError);
  });

  test("bytes are copied when the response is built: a buffer changed afterwards changes neither the answer nor the replay", async () => {
    const { handler } = built((context) => {
      const bytes = new Uint8Array([1, 2, 3, 4]);
      const view = new Uint16Array(new Uint8Array([9, 9, 5, 6, 7, 8, 9, 9]).buffer, 2, 2);
      const response = context.respond(bytes, { status: 201 });
      const second = context.respond(view);
      bytes.fill(0);
      new Uint8Array(view.buffer).fill(0);
      return second.arrayBuffer().then((b) => {
        assert.deepEqual([...new Uint8Array(b)], [5, 6, 7, 8], "a view sends its own bytes only");
        return response;
      });
    });
    assert.deepEqual([...new Uint8Array(await (await handler(post({ a: 1 }, '"b1"'))).arrayBuffer())], [1, 2, 3, 4]);
    assert.deepEqual([...new Uint8Array(await (await handler(post({ a: 1 }, '"b1"'))).arrayBuffer())], [1, 2, 3, 4]);
  });

  test("a response built any other way, or one whose body the handler used, is read to store it", async () => {
    const stream = () =>
      new ReadableStream({
        start(c) {
          c.enqueue(new TextEncoder().encode("streamed"));
          c.close();
        },
      });
    const { handler, state } = built((context) => context.respond(stream(), { status: 201 }));
    const first = await handler(post({ a: 1 }, '"s1"'));
    assert.notEqual(first, state.returned[0], "a new response with the bytes read");
    assert.equal(await first.text(), "streamed");
    assert.equal(await (await handler(post({ a: 1 }, '"s1"'))).text(), "streamed");
    // The handler read its own response: nothing can be stored, the attempt fails as a throw
    // does, and the retry runs again.
    const used = built(async (context) => {
      const response = context.respond("once", { status: 201 });
      await response.text();
      return response;
    });
    await assert.rejects(used.handler(post({ a: 1 }, '"u1"')), TypeError);
    await assert.rejects(used.handler(post({ a: 1 }, '"u1"')), TypeError);
    assert.equal(used.state.executions, 2);
  });

  test("a stream given to respond goes out as it comes once it passes the limit, produced as the client reads, and is kept as response-not-stored (IDEM-STORE-5)", async () => {
    let pulled = 0;
    let cancelled = false;
    const handler = withIdempotency(
      async (request) => {
        await request.text();
        const endless = new ReadableStream(
          {
            pull(controller) {
              pulled++;
              controller.enqueue(new Uint8Array(100).fill(48 + (pulled % 10)));
            },
            cancel() {
              cancelled = true;
            },
          },
          { highWaterMark: 0 },
        );
        return idempotencyOf(request).respond(endless, { status: 200, headers: { "content-type": "application/octet-stream" } });
      },
      { principal: "none", store: new MemoryStore(), maxResponseBytes: 1_000 },
    );
    const held = new Promise((resolve, reject) => setTimeout(() => reject(new Error("the answer was held")), 5_000).unref());
    const first = await Promise.race([handler(post({ a: 1 }, '"long-1"')), held]);
    assert.equal(first.status, 200);
    assert.equal(first.headers.get("content-type"), "application/octet-stream");
    assert.ok(pulled <= 12, `${pulled} chunks made before the answer: no more than the limit and one`);
    const reader = first.body.getReader();
    let got = 0;
    for (let i = 0; i < 30; i++) got += (await reader.read()).value.byteLength;
    assert.equal(got, 3_000);
    assert.ok(pulled <= 32, `${pulled} chunks made for 30 read`);
    await reader.cancel();
    assert.equal(cancelled, true, "the handler's stream is cancelled when the client leaves");
    const retry = await handler(post({ a: 1 }, '"long-1"'));
    assert.equal(retry.status, 410);
    assert.equal((await problem(retry)).type, "urn:idem:problem:response-not-stored");
  });

  test("an answer that stalls is let go when the lease ends, as heartbeats extend it: a 500 problem, and the retry runs again (IDEM-OUT-7)", async () => {
    const runs = [];
    let cancelled = 0;
    // One chunk, then nothing: never ends.
    const stalling = () =>
      new ReadableStream({
        start(controller) {
          controller.enqueue(new TextEncoder().encode("partial "));
        },
        cancel() {
          cancelled++;
        },
      });
    const handler = withIdempotency(
      async (request) => {
        const context = idempotencyOf(request);
        runs.push(context.recovered);
        const how = new URL(request.url).searchParams.get("how");
        if (runs.length > 2) return new Response("answered");
        // Given to respond (read chunk by chunk), or a Response of its own (read whole).
        return how === "respond" ? context.respond(stalling(), { status: 201 }) : new Response(stalling(), { status: 201 });
      },
      { principal: "none", store: new MemoryStore(), lease: 300 },
    );
    const at = (how, key) =>
      new Request(`${URL_ORDERS}?how=${how}`, { method: "POST", headers: { "content-type": "application/json", "idempotency-key": key }, body: '{"a":1}' });
    for (const how of ["respond", "response"]) {
      const since = Date.now();
      const first = await handler(at(how, `"stall-${how}"`));
      assert.ok(Date.now() - since >= 300, `${how}: not before the lease ends`);
      assert.equal(first.status, 500, how);
      const body = await problem(first);
      assert.equal(body.type, "about:blank");
      assert.equal(body.detail, "the response body was not read whole before the lease ended");
    }
    assert.equal(cancelled, 1, "the stream given to respond is cancelled");
    // The outcome is unknown: the retry runs again, as a recovery.
    const retry = await handler(at("respond", '"stall-respond"'));
    assert.equal(await retry.text(), "answered");
    assert.deepEqual(runs, [false, false, true]);

    // A body that ends past the claim's lease, within the one a heartbeat gave: stored.
    const beating = withIdempotency(
      async (request) => {
        const context = idempotencyOf(request);
        const body = new ReadableStream({
          async start(controller) {
            await new Promise((resolve) => setTimeout(resolve, 200));
            await context.extend();
            await new Promise((resolve) => setTimeout(resolve, 200));
            controller.enqueue(new TextEncoder().encode("late"));
            controller.close();
          },
        });
        return context.respond(body, { status: 201 });
      },
      { principal: "none", store: new MemoryStore(), lease: 300 },
    );
    const first = await beating(post({ a: 1 }, '"beats"'));
    assert.equal(first.status, 201);
    assert.equal(await first.text(), "late");
    const replay = await beating(post({ a: 1 }, '"beats"'));
    assert.equal(replay.headers.get("idempotent-replayed"), "true");
    assert.equal(await replay.text(), "late");

    // A heartbeat whose write is still on its way when the lease ends: it is waited for.
    const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
    const inner = new MemoryStore();
    let slow = false;
    const remote = {
      load: (key) => inner.load(key),
      apply: async (key, write, now, info) => {
        if (slow) await sleep(600);
        return inner.apply(key, write, now, info);
      },
    };
    let extended = false;
    const late = withIdempotency(
      async (request) => {
        const context = idempotencyOf(request);
        const body = new ReadableStream({
          async start(controller) {
            await sleep(600);
            // Written from 600 to 1,200 ms: the lease's first end (1,000 ms) comes meanwhile.
            slow = true;
            context.extend().then(() => (extended = true));
            await sleep(700);
            controller.enqueue(new TextEncoder().encode("late"));
            controller.close();
          },
        });
        return context.respond(body, { status: 201 });
      },
      { principal: "none", store: remote, lease: 1_000 },
    );
    const answer = await late(post({ a: 1 }, '"in-flight"'));
    slow = false;
    assert.equal(extended, true);
    assert.equal(answer.status, 201);
    assert.equal(await answer.text(), "late");
  });

  test("text chunks of a stream given to respond are its UTF-8 bytes, within the limit and past it (IDEM-STORE-5)", async () => {
    const text = (n) =>
      new ReadableStream({
        start(controller) {
          for (let i = 0; i < n; i++) controller.enqueue("é".repeat(50));
          controller.close();
        },
      });
    for (const n of [5, 20]) {
      const handler = withIdempotency((request) => idempotencyOf(request).respond(text(n), { status: 201 }), {
        principal: "none",
        store: new MemoryStore(),
        maxResponseBytes: 1_000,
      });
      const answer = await handler(post({ a: 1 }, `"text-${n}"`));
      assert.equal(answer.status, 201);
      assert.equal(await answer.text(), "é".repeat(50 * n), `${n * 100} bytes`);
    }
  });

  test("a null body status stores no body, and the response is the handler's", async () => {
    const { handler, state } = built((context) => context.respond(null, { status: 204 }));
    const first = await handler(post({ a: 1 }, '"n1"'));
    assert.equal(first, state.returned[0]);
    assert.equal(first.status, 204);
    const replay = await handler(post({ a: 1 }, '"n1"'));
    assert.equal(replay.status, 204);
    assert.equal(replay.headers.get("idempotent-replayed"), "true");
  });
});

describe("concurrent duplicates", () => {
  test("32 duplicates released together through the memory store: exactly one executes, the rest get 409 + Retry-After (IDEM-EXEC-1, IDEM-CONC-1, IDEM-JS-3)", async () => {
    for (let round = 0; round < 5; round++) {
      const gate = barrier();
      const { handler, state } = orders({ gate: () => gate.wait() });
      const key = `"race-${round}"`;
      const responses = Array.from({ length: 32 }, () => handler(post({ sku: "x" }, key)));
      // Let every request reach the store before the winner's handler may finish.
      await new Promise((resolve) => setTimeout(resolve, 20));
      gate.open();
      const all = await Promise.all(responses);
      const statuses = all.map((r) => r.status).sort();
      assert.equal(state.executions, 1, `round ${round}`);
      assert.equal(statuses.filter((s) => s === 201).length, 1);
      assert.equal(statuses.filter((s) => s === 409).length, 31);
      for (const r of all.filter((r) => r.status === 409)) {
        assert.ok(Number(r.headers.get("retry-after")) >= 1);
        const p = await problem(r);
        assert.equal(p.type, "urn:idem:problem:in-progress");
        assert.equal(p.requirement, "IDEM-CONC-1");
      }
    }
  });

  test("over real loopback connections, concurrent duplicates run the handler once", async () => {
    let executions = 0;
    let gate = barrier();
    const handler = withIdempotency(
      async () => {
        executions++;
        await gate.wait();
        return new Response("made", { status: 201 });
      },
      { principal: "none", store: new MemoryStore() },
    );
    const server = await serve(handler);
    try {
      for (let round = 0; round < 3; round++) {
        gate = barrier();
        const start = barrier();
        const sends = Array.from({ length: 16 }, async () => {
          await start.wait();
          const r = await fetch(`${server.url}/orders`, {
            method: "POST",
            headers: { "idempotency-key": `"net-${round}"`, "content-type": "application/json", connection: "close" },
            body: "{}",
            signal: AbortSignal.timeout(5000),
          });
          await r.arrayBuffer();
          return { status: r.status, replayed: r.headers.get("idempotent-replayed") === "true" };
        });
        start.open();
        setTimeout(() => gate.open(), 50);
        const results = await Promise.all(sends);
        // One original; every other answer is a 409 or, once it completed, a replay.
        assert.equal(results.filter((r) => r.status === 201 && !r.replayed).length, 1);
        assert.ok(results.every((r) => r.status === 409 || r.status === 201));
        assert.equal(executions, round + 1);
      }
    } finally {
      await server.close();
    }
  });
});

describe("mismatch", () => {
  test("a changed payload gets 422 naming the fields and the original still replays (IDEM-FP-1, IDEM-FP-4)", async () => {
    const { handler, state } = orders();
    await handler(post({ amount: 10, currency: "usd" }));
    const r = await handler(post({ amount: 11, currency: "usd" }));
    assert.equal(r.status, 422);
    const p = await problem(r);
    assert.equal(p.type, "urn:idem:problem:key-reuse-mismatch");
    assert.match(p.detail, /amount/);
    assert.doesNotMatch(p.detail, /currency/);
    const original = await handler(post({ currency: "usd", amount: 10 }));
    assert.equal(original.headers.get("idempotent-replayed"), "true");
    assert.equal(state.executions, 1);
    assert.ok(state.events.find((e) => e.name === "mismatch").securityRelevant);
  });

  test("configured headers are part of the fingerprint, on both paths (IDEM-FP-1)", async () => {
    const { handler, state } = orders({ idem: { fingerprint: { headers: ["X-Api-Version"] } } });
    const v = (version) => post({ a: 1 }, '"fh"', version === null ? {} : { "x-api-version": version });
    assert.equal((await handler(v("2024-01"))).status, 201);
    assert.equal((await handler(v("2024-01"))).headers.get("idempotent-replayed"), "true");
    assert.equal((await handler(v("2025-06"))).status, 422);
    assert.equal((await handler(v(null))).status, 422, "a missing header is a change too");
    assert.equal(state.executions, 1);
    // Unconfigured headers do not count.
    const traced = await handler(post({ a: 1 }, '"fh"', { "x-api-version": "2024-01", "x-trace": "9" }));
    assert.equal(traced.headers.get("idempotent-replayed"), "true");

    const idem = new Idempotency({ principal: "none", store: new MemoryStore(), fingerprint: { headers: ["x-api-version"] } });
    const plain = (headers) => ({ method: "POST", target: "/p", key: "k", headers, body: new Uint8Array(0) });
    const run = () => ({ status: 200 });
    assert.equal((await idem.handle(plain({ "X-Api-Version": "1" }), run)).replayed, false);
    assert.equal((await idem.handle(plain([["x-api-version", "1"]]), run)).replayed, true);
    assert.equal((await idem.handle(plain(new Headers({ "x-api-version": "1" })), run)).replayed, true);
    assert.equal((await idem.handle(plain({ "x-api-version": "2" }), run)).status, 422);
  });

  test("excluded volatile fields do not count as a change (IDEM-FP-5)", async () => {
    const { handler, state } = orders({ idem: { fingerprint: { exclude: ["/sentAt"] } } });
    await handler(post({ amount: 1, sentAt: 1 }));
    const r = await handler(post({ amount: 1, sentAt: 2 }));
    assert.equal(r.headers.get("idempotent-replayed"), "true");
    assert.equal(state.executions, 1);
  });
});

describe("missing and malformed keys", () => {
  const cases = [
    ["missing", null, "missing-key", "IDEM-KEY-3"],
    ["empty", "", "missing-key", "IDEM-KEY-3"],
    ["unterminated string", '"abc', "malformed-key", "IDEM-KEY-1"],
    ["bad escape", '"a\\x"', "malformed-key", "IDEM-KEY-1"],
    ["too long", `"${"k".repeat(256)}"`, "malformed-key", "IDEM-KEY-6"],
    ["a list", '"a", "b"', "malformed-key", "IDEM-KEY-5"],
    ["a bare key with a quote", 'ab"c', "malformed-key", "IDEM-KEY-1"],
  ];
  for (const [name, key, slug, code] of cases) {
    test(`${name}: 400 ${slug}, nothing runs`, async () => {
      const { handler, state } = orders();
      const r = await handler(post({ a: 1 }, key));
      assert.equal(r.status, 400);
      const p = await problem(r);
      assert.equal(p.type, `urn:idem:problem:${slug}`);
      // The problem body and the event cite the same requirement: both come from the
      // core's one renderer (two keys are IDEM-KEY-5 in both).
      assert.equal(p.requirement, code);
      assert.equal(state.executions, 0);
      assert.equal(state.events[0].code, code);
    });
  }

  test("strict keys refuse bare tokens; UUID keys need the configured version (IDEM-KEY-2, IDEM-KEY-4)", async () => {
    const strict = orders({ idem: { keyKind: "opaque-strict" } });
    assert.equal((await strict.handler(post({}, "bare"))).status, 400);
    assert.equal((await strict.handler(post({}, '"quoted"'))).status, 201);
    const uuid = orders({ idem: { keyKind: "uuid-v4" } });
    assert.equal((await uuid.handler(post({}, "not-a-uuid"))).status, 400);
    const v7 = "018f6d2e-8a4b-7c3d-9e1f-0a1b2c3d4e5f";
    assert.equal((await uuid.handler(post({}, v7))).status, 400);
    const v4 = "9B2F1C3E-4A5D-4E6F-8A7B-0C1D2E3F4A5B";
    assert.equal((await uuid.handler(post({}, v4))).status, 201);
    const lower = await uuid.handler(post({}, v4.toLowerCase()));
    assert.equal(lower.headers.get("idempotent-replayed"), "true");
    assert.equal(uuid.state.executions, 1);
  });

  test("bodies: invalid JSON gets 400, an oversized body 413, before anything is claimed (IDEM-FP-6, IDEM-LIMIT-1)", async () => {
    const store = new MemoryStore();
    const { handler, state } = orders({ store, idem: { fingerprint: { maxBody: 64 } } });
    const bad = await handler(post("{not json"));
    assert.equal(bad.status, 400);
    assert.equal((await problem(bad)).type, "urn:idem:problem:invalid-json");
    const big = await handler(post({ pad: "x".repeat(100) }));
    assert.equal(big.status, 413);
    assert.equal((await problem(big)).type, "urn:idem:problem:body-too-large");
    const announced = await handler(post({ a: 1 }, '"k"', { "content-length": "100000" }));
    assert.equal(announced.status, 413);
    assert.equal(state.executions, 0);
    assert.equal(store.size, 0);
  });
});

describe("leases", () => {
  test("after the lease expires a retry takes over with recovered: true, and the stale completion is fenced out (IDEM-LEASE-1, IDEM-LEASE-2)", async () => {
    const clock = manualClock();
    const first = deferred();
    const contexts = [];
    let executions = 0;
    const events = [];
    const handler = withIdempotency(
      async (request) => {
        const n = ++executions;
        contexts.push(idempotencyOf(request));
        if (n === 1) await first.promise;
        return new Response(`run ${n}`, { status: 201 });
      },
      { principal: "none", store: new MemoryStore(), lease: 1000, now: clock, onEvent: (e) => events.push(e.name) },
    );
    const zombie = handler(post({ a: 1 }));
    await new Promise((resolve) => setTimeout(resolve, 10));
    const early = await handler(post({ a: 1 }));
    assert.equal(early.status, 409);
    clock.advance(1001);
    const takeover = await handler(post({ a: 1 }));
    assert.equal(await takeover.text(), "run 2");
    assert.equal(contexts[1].recovered, true);
    assert.equal(contexts[1].fence, 2);
    first.resolve();
    // The zombie's result is not stored, and its caller gets the key's outcome: the stored
    // response of the attempt that took over, replayed, never "run 1" (IDEM-LEASE-5).
    const lost = await zombie;
    assert.equal(await lost.text(), "run 2");
    assert.equal(lost.headers.get("idempotent-replayed"), "true");
    assert.ok(events.includes("fenced-out"));
    const replay = await handler(post({ a: 1 }));
    assert.equal(await replay.text(), "run 2");
    assert.equal(replay.headers.get("idempotent-replayed"), "true");
  });

  test("a zombie whose successor still runs is told 409 in-progress; one whose successor released the key, 409 superseded (IDEM-LEASE-5)", async () => {
    const clock = manualClock();
    const gates = [deferred(), deferred()];
    let executions = 0;
    const handler = withIdempotency(
      async (request) => {
        const n = ++executions;
        const { status } = await request.json();
        await gates[n - 1]?.promise;
        return new Response(`run ${n}`, { status: n === 1 ? 201 : status });
      },
      { principal: "none", store: new MemoryStore(), lease: 1000, now: clock },
    );
    for (const [status, type] of [
      [201, "urn:idem:problem:in-progress"],
      [429, "urn:idem:problem:superseded"],
    ]) {
      executions = 0;
      gates.splice(0, 2, deferred(), deferred());
      const key = `"zombie-${status}"`;
      const zombie = handler(post({ status }, key));
      await new Promise((resolve) => setTimeout(resolve, 10));
      clock.advance(1001);
      const successor = handler(post({ status }, key));
      await new Promise((resolve) => setTimeout(resolve, 10));
      if (status === 429) {
        gates[1].resolve();
        assert.equal((await successor).status, 429);
      }
      gates[0].resolve();
      const lost = await zombie;
      assert.equal(lost.status, 409);
      const p = await problem(lost);
      assert.equal(p.type, type);
      assert.ok(Number(lost.headers.get("retry-after")) >= 1);
      gates[1].resolve();
      await successor;
    }
  });

  test("a duplicate in flight is told to come back within the Retry-After bound, not when the whole lease ends (IDEM-CONC-3, IDEM-CONC-4)", async () => {
    for (const [idem, expected] of [
      [{}, "2"],
      [{ maxRetryAfter: 5000 }, "5"],
      [{ lease: 3000, maxRetryAfter: 60_000 }, "3"],
    ]) {
      const gate = deferred();
      const { handler } = orders({ gate: () => gate.promise, idem });
      const first = handler(post({ sku: "x" }, '"retry-after"'));
      await new Promise((resolve) => setTimeout(resolve, 10));
      const dup = await handler(post({ sku: "x" }, '"retry-after"'));
      assert.equal(dup.status, 409);
      assert.equal(dup.headers.get("retry-after"), expected, JSON.stringify(idem));
      gate.resolve();
      assert.equal((await first).status, 201);
    }
  });

  test("a heartbeat extends the lease; after a takeover it is refused (IDEM-LEASE-3)", async () => {
    const clock = manualClock();
    const release = deferred();
    let ctx;
    const handler = withIdempotency(
      async (request) => {
        ctx ??= idempotencyOf(request); // the first execution's context
        await release.promise;
        return new Response("done");
      },
      { principal: "none", store: new MemoryStore(), lease: 1000, now: clock },
    );
    const running = handler(post({}));
    await new Promise((resolve) => setTimeout(resolve, 10));
    clock.advance(800);
    await ctx.extend();
    clock.advance(800); // 1600 ms after the claim, 800 ms after the heartbeat
    assert.equal((await handler(post({}))).status, 409);
    clock.advance(1000);
    const takeover = handler(post({}));
    await new Promise((resolve) => setTimeout(resolve, 10));
    await assert.rejects(ctx.extend(), (e) => e instanceof RangeError && e.code === "IDEM-LEASE-3");
    release.resolve();
    await running;
    await takeover;
  });

  test("a handler that throws leaves the outcome unknown: the retry re-executes as a recovery (IDEM-OUT-3)", async () => {
    let n = 0;
    const recovered = [];
    const handler = withIdempotency(
      async (request) => {
        recovered.push(idempotencyOf(request).recovered);
        if (++n === 1) throw new Error("crash");
        return new Response("ok");
      },
      { principal: "none", store: new MemoryStore() },
    );
    await assert.rejects(handler(post({})), /crash/);
    assert.equal((await handler(post({}))).status, 200);
    assert.deepEqual(recovered, [false, true]);
  });

  test("with unknownOutcome: hold, a key whose handler threw is refused with 409 outcome-unknown", async () => {
    const handler = withIdempotency(
      async () => {
        throw new Error("crash");
      },
      { principal: "none", store: new MemoryStore(), unknownOutcome: "hold" },
    );
    await assert.rejects(handler(post({})));
    const r = await handler(post({}));
    assert.equal(r.status, 409);
    assert.equal((await problem(r)).type, "urn:idem:problem:outcome-unknown");
  });
});

describe("the same semantics through an asynchronous store", () => {
  // The memory store is claimed and completed inside the module; any other store goes
  // through the JavaScript claim loop and compare-and-set writes. Both must behave alike.
  const stores = {
    "in-module memory store": () => new MemoryStore(),
    "asynchronous store": () => {
      const inner = new MemoryStore();
      const later = () => new Promise((resolve) => setImmediate(resolve));
      return {
        load: async (k) => (await later(), inner.load(k)),
        apply: async (k, w, now) => (await later(), inner.apply(k, w, now)),
      };
    },
  };
  for (const [kind, makeStore] of Object.entries(stores)) {
    test(`${kind}: heartbeats extend the lease; a zombie's heartbeat and completion are fenced out (IDEM-LEASE-2, IDEM-LEASE-3)`, async () => {
      const clock = manualClock();
      const events = [];
      const gates = [deferred(), deferred()];
      const contexts = [];
      const handler = withIdempotency(
        async (request) => {
          const n = contexts.push(idempotencyOf(request)) - 1;
          await gates[n].promise;
          return new Response(`run ${n}`, { status: 201 });
        },
        { principal: "none", store: makeStore(), lease: 1000, now: clock, onEvent: (e) => events.push(e.name) },
      );
      const first = handler(post({}));
      while (contexts.length < 1) await tick();
      const [zombie] = contexts;
      const claimedUntil = zombie.leaseExpires;
      clock.advance(800);
      await zombie.extend();
      assert.equal(zombie.leaseExpires, claimedUntil + 800);
      clock.advance(800); // past the first lease, within the extended one
      assert.equal((await handler(post({}))).status, 409);
      clock.advance(1000); // the extended lease has ended: a retry takes over
      const second = handler(post({}));
      while (contexts.length < 2) await tick();
      assert.equal(contexts[1].recovered, true);
      assert.ok(contexts[1].fence > zombie.fence);
      // The zombie's clock still says its lease holds: the store refuses it all the same.
      clock.set(zombie.leaseExpires - 1);
      await assert.rejects(zombie.extend(), (e) => e instanceof RangeError && e.code === "IDEM-LEASE-2");
      gates[0].resolve();
      // The zombie's caller is told what a retry would be: the successor still runs
      // (IDEM-LEASE-5).
      assert.equal((await first).status, 409, "the zombie is answered with the key's outcome");
      clock.advance(2000);
      gates[1].resolve();
      assert.equal(await (await second).text(), "run 1");
      const replay = await handler(post({}));
      assert.equal(replay.headers.get("idempotent-replayed"), "true");
      assert.equal(await replay.text(), "run 1", "the winner's response is the one stored");
      assert.ok(events.filter((e) => e === "fenced-out").length >= 2, events.join(","));
      assert.ok(events.includes("extended") && events.includes("took-over") && events.includes("completed"));
    });

    test(`${kind}: a duplicate waits for the first result and gets the replay (IDEM-CONC-1)`, async () => {
      const { handler, state } = orders({
        store: makeStore(),
        gate: () => new Promise((resolve) => setTimeout(resolve, 60)),
        idem: { inFlight: { wait: 2000, poll: 10 } },
      });
      const a = handler(post({ a: 1 }));
      await new Promise((resolve) => setTimeout(resolve, 10));
      const b = await handler(post({ a: 1 }));
      assert.equal((await a).status, 201);
      assert.equal(b.headers.get("idempotent-replayed"), "true");
      assert.equal(state.executions, 1);
    });
  }
});

describe("in-flight wait policy", () => {
  test("a duplicate waits for the first result and gets the replay (IDEM-CONC-1)", async () => {
    const { handler, state } = orders({
      gate: () => new Promise((resolve) => setTimeout(resolve, 80)),
      idem: { inFlight: { wait: 2000, poll: 10 } },
    });
    const [a, b] = await Promise.all([handler(post({ a: 1 })), (async () => {
      await new Promise((resolve) => setTimeout(resolve, 10));
      return handler(post({ a: 1 }));
    })()]);
    assert.equal(a.status, 201);
    assert.equal(b.status, 201);
    assert.equal(b.headers.get("idempotent-replayed"), "true");
    assert.equal(await b.text(), await a.text());
    assert.equal(state.executions, 1);
  });

  test("only the latest waiter keeps waiting; an earlier one is answered at once", async () => {
    const release = deferred();
    const { handler, state } = orders({ gate: () => release.promise, idem: { inFlight: { wait: 5000, poll: 10 } } });
    const first = handler(post({ a: 1 }));
    await new Promise((resolve) => setTimeout(resolve, 10));
    const older = handler(post({ a: 1 }));
    await new Promise((resolve) => setTimeout(resolve, 30));
    const newer = handler(post({ a: 1 }));
    const olderResponse = await older;
    assert.equal(olderResponse.status, 409);
    release.resolve();
    const newerResponse = await newer;
    assert.equal(newerResponse.headers.get("idempotent-replayed"), "true");
    assert.equal((await first).status, 201);
    assert.equal(state.executions, 1);
  });

  test("the wait is bounded: past it the duplicate gets 409", async () => {
    const release = deferred();
    const { handler } = orders({ gate: () => release.promise, idem: { inFlight: { wait: 60, poll: 10 } } });
    const first = handler(post({ a: 1 }));
    await new Promise((resolve) => setTimeout(resolve, 5));
    const started = Date.now();
    const dup = await handler(post({ a: 1 }));
    assert.equal(dup.status, 409);
    assert.ok(Date.now() - started >= 50);
    release.resolve();
    await first;
  });
});

describe("stores", () => {
  test("expiry: a tombstoned key gets 410 and a forgotten key runs again (IDEM-TTL-1, IDEM-TTL-2, IDEM-TTL-3, IDEM-TTL-4)", async () => {
    const clock = manualClock();
    const store = new MemoryStore();
    const { handler, state } = orders({ store, idem: { responseTtl: 1000, keyTtl: 5000, lease: 1000, now: clock } });
    await handler(post({ a: 1 }));
    clock.advance(999);
    assert.equal((await handler(post({ a: 1 }))).headers.get("idempotent-replayed"), "true");
    clock.advance(1);
    const gone = await handler(post({ a: 1 }));
    assert.equal(gone.status, 410);
    assert.equal((await problem(gone)).type, "urn:idem:problem:key-expired");
    assert.ok(state.events.find((e) => e.name === "tombstone-hit").securityRelevant);
    assert.equal(store.sweep(clock()), 1); // the record becomes a tombstone
    clock.advance(4000);
    assert.equal(store.sweep(clock()), 1); // and is deleted with its key
    assert.equal(store.size, 0);
    assert.equal((await handler(post({ a: 1 }))).status, 201);
    assert.equal(state.executions, 2);
  });

  test("a full store refuses new claims with 503 store-full and runs nothing (IDEM-STORE-3)", async () => {
    const { handler, state } = orders({ principal: "none", store: new MemoryStore({ maxEntries: 2 }) });
    await handler(post({}, '"a"'));
    await handler(post({}, '"b"'));
    const r = await handler(post({}, '"c"'));
    assert.equal(r.status, 503);
    assert.ok(r.headers.get("retry-after"));
    assert.equal((await problem(r)).type, "urn:idem:problem:store-full");
    assert.equal(state.executions, 2);
    assert.equal((await handler(post({}, '"a"'))).headers.get("idempotent-replayed"), "true");
  });

  test("a failing store refuses with 503 store-unavailable and runs nothing; a failed completion still answers (IDEM-STORE-4, IDEM-OUT-5)", async () => {
    const inner = new MemoryStore();
    let failLoads = true;
    let failApplies = false;
    const store = {
      load: (k) => {
        if (failLoads) throw new Error("down");
        return inner.load(k);
      },
      apply: (k, w, now) => {
        if (failApplies && w.expect !== null) throw new Error("down");
        return inner.apply(k, w, now);
      },
    };
    const { handler, state } = orders({ store });
    const r = await handler(post({}));
    assert.equal(r.status, 503);
    assert.equal((await problem(r)).type, "urn:idem:problem:store-unavailable");
    assert.equal(state.executions, 0);
    failLoads = false;
    failApplies = true;
    const done = await handler(post({}));
    assert.equal(done.status, 201);
    assert.equal(state.executions, 1);
    assert.ok(state.events.some((e) => e.code === "IDEM-STORE-4"));
  });

  test("a custom store's StoreFullError maps to 503 store-full", async () => {
    const store = {
      load: () => null,
      apply: () => {
        throw new StoreFullError();
      },
    };
    const { handler } = orders({ store });
    assert.equal((await problem(await handler(post({})))).type, "urn:idem:problem:store-full");
  });

  test("a MemoryStore full by bytes refuses new keys with 503 but completes what runs (IDEM-STORE-3)", async () => {
    const store = new MemoryStore({ maxBytes: 1500 });
    const { handler, state } = orders({ store });
    assert.equal((await handler(post({ note: "x".repeat(200) }, '"a"'))).status, 201);
    assert.ok(store.bytes > 200 && store.bytes <= 1500, `bytes held: ${store.bytes}`);
    const big = await handler(post({ note: "y".repeat(900) }, '"b"'));
    assert.equal(big.status, 201, "the claim fits; its response is stored even past the limit");
    const refused = await handler(post({}, '"c"'));
    assert.equal(refused.status, 503);
    assert.equal((await problem(refused)).type, "urn:idem:problem:store-full");
    assert.equal(state.executions, 2);
    assert.ok(state.events.some((e) => e.name === "rejected" && e.code === "IDEM-STORE-3"));
    assert.equal((await handler(post({ note: "x".repeat(200) }, '"a"'))).headers.get("idempotent-replayed"), "true");
  });

  test("the MemoryStore's generic interface takes the engine's storage keys only (IDEM-STORE-1)", async () => {
    const inner = new MemoryStore();
    const keys = new Set();
    // A custom store that forwards to a MemoryStore runs the JavaScript claim loop.
    const store = {
      load: (k) => (keys.add(k), inner.load(k)),
      apply: (k, w, now) => inner.apply(k, w, now),
    };
    const { handler, state } = orders({ store });
    await handler(post({ a: 1 }));
    assert.equal((await handler(post({ a: 1 }))).headers.get("idempotent-replayed"), "true");
    assert.equal(state.executions, 1);
    const [key] = keys;
    const record = inner.load(key);
    assert.match(record.version, /^[0-9]+$/);
    assert.ok(record.value instanceof Uint8Array);
    assert.equal(inner.apply(key, { expect: "1", value: null, version: "", deadline: 0 }, Date.now()), false);
    assert.throws(() => inner.load("not a key") ?? inner.apply("not a key", { expect: null, value: record.value }, 0), (e) => e.code === "IDEM-JS-1");
    assert.throws(() => inner.apply(key, { expect: record.version, value: new Uint8Array([1, 2]) }, 0), (e) => e.code === "IDEM-REC-1");
    assert.equal(inner.apply(key, { expect: record.version, value: null, version: "", deadline: 0 }, Date.now()), true);
    assert.equal(inner.size, 0);
  });

  test("stored bytes that are not a record are an error, never a claim (IDEM-REC-1)", async () => {
    const store = { load: () => ({ version: "1", value: new Uint8Array([1, 2, 3]) }), apply: () => true };
    const { handler, state } = orders({ store });
    await assert.rejects(handler(post({})), (e) => e instanceof RangeError && e.code === "IDEM-REC-1");
    assert.equal(state.executions, 0);
  });
});

describe("options", () => {
  const bad = [
    [{}, "IDEM-JS-1"],
    [{ principal: "none", store: {} }, "IDEM-JS-1"],
    [{ principal: "none", store: new MemoryStore(), lease: 0 }, "IDEM-JS-1"],
    [{ principal: "none", store: new MemoryStore(), lease: -1 }, "IDEM-JS-1"],
    [{ principal: "none", store: new MemoryStore(), lease: 1.5 }, "IDEM-JS-1"],
    [{ principal: "none", store: new MemoryStore(), responseTtl: "1d" }, "IDEM-JS-1"],
    [{ principal: "none", store: new MemoryStore(), unknownOutcome: "retry" }, "IDEM-JS-1"],
    [{ principal: "none", store: new MemoryStore(), keyKind: "ulid" }, "IDEM-JS-1"],
    [{ principal: "none", store: new MemoryStore(), keys: "sometimes" }, "IDEM-JS-1"],
    [{ principal: "none", store: new MemoryStore(), inFlight: { wait: -1 } }, "IDEM-JS-1"],
    [{ principal: "none", store: new MemoryStore(), fingerprint: { json: "xml" } }, "IDEM-JS-1"],
    [{ principal: "none", store: new MemoryStore(), fingerprint: { unknown: true } }, "IDEM-JS-1"],
    [{ principal: "none", store: new MemoryStore(), responseTTL: 5 }, "IDEM-JS-1"],
    [{ principal: "none", store: new MemoryStore(), responseTtl: 5000, keyTtl: 1000 }, "IDEM-TTL-2"],
  ];
  for (const [options, code] of bad) {
    test(`refuses ${JSON.stringify(options)} with RangeError ${code} (IDEM-JS-1)`, () => {
      assert.throws(
        () => withIdempotency(() => new Response(), options),
        (e) => e instanceof RangeError && e.code === code,
      );
    });
  }
  test("a bad MemoryStore size is refused", () => {
    for (const limits of [{ maxEntries: 0 }, { maxEntries: 1.5 }, { maxBytes: 0 }, { maxBytes: "1mb" }]) {
      assert.throws(() => new MemoryStore(limits), (e) => e instanceof RangeError && e.code === "IDEM-JS-1");
    }
  });
});

describe("plain API and packaging", () => {
  test("Idempotency#handle runs once and replays, with plain objects", async () => {
    const idem = new Idempotency({ principal: "none", store: new MemoryStore() });
    let runs = 0;
    const req = () => ({
      method: "POST",
      target: "/pay?x=1",
      key: '"p1"',
      contentType: "application/json",
      body: new TextEncoder().encode('{"amount":5}'),
    });
    const run = () => {
      runs++;
      return { status: 201, headers: { "content-type": "text/plain" }, body: "paid" };
    };
    const a = await idem.handle(req(), run);
    const b = await idem.handle(req(), run);
    assert.equal(a.replayed, false);
    assert.equal(b.replayed, true);
    assert.equal(new TextDecoder().decode(b.body), "paid");
    assert.deepEqual(b.headers.slice(0, 2), ["content-type", "text/plain"]);
    assert.equal(runs, 1);
  });

  test("the CommonJS entry loads and works", async () => {
    const require = createRequire(import.meta.url);
    const cjs = require("idem");
    assert.equal(typeof cjs.withIdempotency, "function");
    const handler = cjs.withIdempotency(() => new Response("x", { status: 201 }), { principal: "none", store: new cjs.MemoryStore() });
    assert.equal((await handler(post({}))).status, 201);
    assert.equal((await handler(post({}))).headers.get("idempotent-replayed"), "true");
  });

  test("the target is the URL's path and query: an empty query and a fragment do not count", async () => {
    const { handler, state } = orders();
    const at = (url) =>
      new Request(url, { method: "POST", headers: { "content-type": "application/json", "idempotency-key": "k" }, body: "{}" });
    assert.equal((await handler(at("http://127.0.0.1/orders?"))).status, 201);
    assert.equal((await handler(at("http://127.0.0.1/orders#x"))).headers.get("idempotent-replayed"), "true");
    assert.equal((await handler(at("http://127.0.0.1/orders?a=1"))).status, 422, "another query is another request");
    assert.equal(state.executions, 1);
  });

  test("replies read from the module's memory stay intact when the memory grows between them", async () => {
    const idem = new Idempotency({ principal: "none", store: new MemoryStore() });
    const req = (key, size) => ({ method: "POST", target: "/big", key, body: new Uint8Array(0), size });
    const run = (size) => () => ({ status: 200, headers: { "x-size": String(size) }, body: new Uint8Array(size).fill(size % 251) });
    await idem.handle(req("small", 3), run(3));
    const before = await idem.handle(req("small", 3), run(3));
    // Responses of several MiB make the module's memory grow.
    for (const [i, size] of [4 << 20, 6 << 20].entries()) {
      await idem.handle(req(`big-${i}`, size), run(size));
      const big = await idem.handle(req(`big-${i}`, size), () => assert.fail("replayed"));
      assert.equal(big.body.length, size);
      assert.equal(big.body[size - 1], size % 251);
    }
    const after = await idem.handle(req("small", 3), run(3));
    assert.deepEqual([...after.body], [...before.body]);
    assert.deepEqual(after.headers, before.headers);
    assert.deepEqual(before.headers, ["x-size", "3", "idempotent-replayed", "true"]);
  });

  test("response headers round-trip exactly, including non-ASCII values and repeated names", async () => {
    const handler = withIdempotency(
      () => {
        const headers = new Headers({ "x-note": "caf\u00e9" });
        headers.append("set-cookie", "a=1");
        headers.append("set-cookie", "b=2");
        headers.append("x-list", "1");
        headers.append("x-list", "2");
        return new Response("ok", { status: 201, headers });
      },
      { principal: "none", store: new MemoryStore() },
    );
    const first = await handler(post({}));
    const again = await handler(post({}));
    assert.equal(again.headers.get("idempotent-replayed"), "true");
    assert.deepEqual(again.headers.getSetCookie(), ["a=1", "b=2"]);
    assert.equal(again.headers.get("x-list"), first.headers.get("x-list"));
    assert.equal(again.headers.get("x-note"), "caf\u00e9");
    assert.equal(await again.text(), "ok");
  });

  test("Idempotency#handle: a throwing handler leaves the outcome unknown, and the retry recovers (IDEM-OUT-3)", async () => {
    const idem = new Idempotency({ principal: "none", store: new MemoryStore() });
    const req = { method: "POST", target: "/pay", key: "t1", contentType: "text/plain", body: new TextEncoder().encode("x") };
    await assert.rejects(idem.handle(req, () => { throw new Error("boom"); }), /boom/);
    let context;
    const reply = await idem.handle(req, (ctx) => {
      context = ctx;
      return { status: 200, headers: [["x-a", "1"]], body: new Uint8Array([1, 2, 3]) };
    });
    assert.equal(context.recovered, true);
    assert.equal(context.key, "t1");
    assert.deepEqual(reply.headers, ["x-a", "1"]);
    const replay = await idem.handle(req, () => assert.fail("must not run"));
    assert.equal(replay.replayed, true);
    assert.deepEqual([...replay.body], [1, 2, 3]);
    const bad = await idem.handle({ ...req, key: null }, () => assert.fail("must not run"));
    assert.equal(bad.status, 400);
    assert.equal(JSON.parse(new TextDecoder().decode(bad.body)).type, "urn:idem:problem:missing-key");
  });

  test("204 responses are stored and replayed without a body", async () => {
    const handler = withIdempotency(() => new Response(null, { status: 204 }), { principal: "none", store: new MemoryStore() });
    assert.equal((await handler(post({}))).status, 204);
    const again = await handler(post({}));
    assert.equal(again.status, 204);
    assert.equal(again.headers.get("idempotent-replayed"), "true");
  });
});

describe("answers the engine cannot record, and bodies of other types", () => {
  const input = (key, body = new TextEncoder().encode('{"amount":5}'), contentType = "application/json") => ({ method: "POST", target: "/pay", key, contentType, body });

  test("a status outside 100–599 (or none) throws, and the key is free at once: the retry runs, told it may follow a run (IDEM-OUT-3)", async () => {
    const idem = new Idempotency({ principal: "none", store: new MemoryStore(), lease: 60_000 });
    for (const status of [0, 99, 600, "abc", undefined]) {
      const key = `"bad-${String(status)}"`;
      await assert.rejects(
        idem.handle(input(key), () => ({ status, body: "charged" })),
        (err) => err instanceof RangeError,
        `status ${String(status)}`,
      );
      let recovered;
      const retry = await idem.handle(input(key), (context) => {
        recovered = context.recovered;
        return { status: 201, body: "charged again" };
      });
      assert.equal(retry.status, 201, `status ${String(status)}: the key was held`);
      assert.equal(retry.executed, true);
      assert.equal(recovered, true);
    }
  });

  test("the same through an asynchronous store", async () => {
    const memory = new MemoryStore();
    const store = { load: async (key) => memory.load(key), apply: async (...args) => memory.apply(...args) };
    const idem = new Idempotency({ principal: "none", store, lease: 60_000 });
    await assert.rejects(idem.handle(input('"async-bad"'), () => ({ status: 0 })), RangeError);
    const retry = await idem.handle(input('"async-bad"'), () => ({ status: 201 }));
    assert.equal(retry.executed, true);
  });

  test("withIdempotency: a handler answering Response.error() (status 0) throws, and the key is free at once", async () => {
    let runs = 0;
    const handler = withIdempotency(
      () => (++runs === 1 ? Response.error() : new Response("ok", { status: 201 })),
      { principal: "none", store: new MemoryStore() },
    );
    await assert.rejects(handler(post({})), RangeError);
    const retry = await handler(post({}));
    assert.equal(retry.status, 201);
    assert.equal(runs, 2);
  });

  test("a body given as an ArrayBuffer, a typed array or a DataView is fingerprinted, stored and replayed byte for byte", async () => {
    const idem = new Idempotency({ principal: "none", store: new MemoryStore() });
    const bytes = [1, 2, 3, 250, 7];
    const forms = { ArrayBuffer: () => new Uint8Array(bytes).buffer, DataView: () => new DataView(new Uint8Array([9, ...bytes]).buffer, 1), Uint16Array: () => new Uint16Array(new Uint8Array([...bytes, 0]).buffer) };
    for (const [name, make] of Object.entries(forms)) {
      let runs = 0;
      const run = () => (runs++, { status: 201, body: make() });
      const key = `"${name}"`;
      const first = await idem.handle(input(key, make(), "application/octet-stream"), run);
      const replay = await idem.handle(input(key, make(), "application/octet-stream"), run);
      assert.equal(replay.replayed, true, name);
      assert.deepEqual([...replay.body], [...new Uint8Array(first.body)], name);
      assert.deepEqual([...replay.body].slice(0, 5), bytes, name);
      // Another payload under the key is another request, not the same empty body.
      const other = await idem.handle(input(key, new Uint8Array([4, 4]).buffer, "application/octet-stream"), run);
      assert.equal(other.status, 422, name);
      assert.equal(runs, 1, name);
    }
  });

  test("a body of another type is refused (IDEM-JS-1): nothing is stored as empty, and the key is free", async () => {
    const idem = new Idempotency({ principal: "none", store: new MemoryStore() });
    for (const body of [{ amount: 5 }, 42, true]) {
      await assert.rejects(idem.handle(input('"req-body"', body), () => assert.fail("ran")), (err) => err.code === "IDEM-JS-1");
      const key = `"answer-${typeof body}"`;
      await assert.rejects(idem.handle(input(key), () => ({ status: 201, body })), (err) => err.code === "IDEM-JS-1");
      const retry = await idem.handle(input(key), () => ({ status: 201, body: "ok" }));
      assert.equal(retry.executed, true, "the key was free");
    }
  });
});

describe("heartbeats of an answer longer than the store keeps (IDEM-STORE-5)", () => {
  test("a handler that heartbeats while it produces goes on: every heartbeat resolves, the whole answer is sent, and a retry gets 410", async () => {
    const errors = [];
    let runs = 0;
    const handler = withIdempotency(
      (request) => {
        runs++;
        const ctx = idempotencyOf(request);
        let chunk = 0;
        return ctx.respond(
          new ReadableStream({
            async pull(controller) {
              try {
                await ctx.extend();
              } catch (err) {
                errors.push(`${err.code}: ${err.message}`);
              }
              if (chunk++ < 6) controller.enqueue(new Uint8Array(512).fill(65));
              else controller.close();
            },
          }),
          { status: 200 },
        );
      },
      { principal: "none", store: new MemoryStore(), maxResponseBytes: 1024 },
    );
    const first = await handler(post("{}"));
    assert.equal(first.status, 200);
    assert.equal((await first.arrayBuffer()).byteLength, 6 * 512);
    assert.deepEqual(errors, []);
    const retry = await handler(post("{}"));
    assert.equal(retry.status, 410);
    assert.equal((await problem(retry)).type, "urn:idem:problem:response-not-stored");
    assert.equal(runs, 1);
  });
});
