// The request lifecycle through the built package, where the JavaScript side once kept rules
// of its own: the principal, heartbeats racing completions, handlers whose response fails,
// refusals of concurrent requests, leases against key retention, and resumed client entries.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { Idempotency, MemoryStore, idempotencyOf, withIdempotency } from "idem";
import { idempotentFetch } from "idem/client";
import { deferred, manualClock, serve, tick } from "./helpers.mjs";

function post(body, key = '"k"', headers = {}) {
  return new Request("http://127.0.0.1/orders", {
    method: "POST",
    headers: { "content-type": "application/json", "idempotency-key": key, ...headers },
    body: JSON.stringify(body),
  });
}

/** A store over a MemoryStore whose writes are slow: they settle a few turns later. */
function slowStore() {
  const inner = new MemoryStore();
  const later = (n) => new Promise((resolve) => setTimeout(resolve, n));
  return {
    inner,
    load: async (k) => (await later(1), inner.load(k)),
    apply: async (k, w, now) => {
      await later(15);
      return inner.apply(k, w, now);
    },
  };
}

describe("the principal is the host's to state (IDEM-SCOPE-3)", () => {
  test("withIdempotency and Idempotency refuse to start without one", () => {
    for (const make of [
      () => withIdempotency(() => new Response(), { store: new MemoryStore() }),
      () => new Idempotency({ store: new MemoryStore() }),
      () => new Idempotency({ store: new MemoryStore(), principal: "anonymous" }),
      () => withIdempotency(() => new Response(), { store: new MemoryStore(), scope: () => "x" }),
    ]) {
      assert.throws(make, (e) => e instanceof RangeError && /principal/.test(e.message) && /IDEM-(SCOPE-3|JS-1)/.test(e.code));
    }
  });

  test("tenant B reusing tenant A's key gets its own execution, never A's response or cookie", async () => {
    const idem = new Idempotency({ store: new MemoryStore(), principal: (input) => input.tenant });
    let runs = 0;
    const run = (tenant) => () => {
      runs++;
      return { status: 201, headers: { "set-cookie": `session=${tenant}` }, body: `order for ${tenant}` };
    };
    const req = (tenant) => ({ method: "POST", target: "/orders", key: '"shared"', tenant, body: new Uint8Array() });
    const a = await idem.handle(req("a"), run("a"));
    const b = await idem.handle(req("b"), run("b"));
    assert.equal(runs, 2);
    assert.equal(b.replayed, false);
    assert.equal(new TextDecoder().decode(b.body), "order for b");
    assert.deepEqual(b.headers, ["set-cookie", "session=b"]);
    assert.equal((await idem.handle(req("a"), run("a"))).replayed, true);
    assert.equal(a.status, 201);
  });

  test("a retry after a token refresh is the same user: it replays, it does not run again", async () => {
    let runs = 0;
    const users = new Map([
      ["token-1", "user-7"],
      ["token-2", "user-7"],
    ]);
    const handler = withIdempotency(
      () => new Response(`run ${++runs}`, { status: 201 }),
      { store: new MemoryStore(), principal: (r) => users.get(r.headers.get("authorization")?.slice(7)) },
    );
    await handler(post({ a: 1 }, '"k"', { authorization: "Bearer token-1" }));
    const retry = await handler(post({ a: 1 }, '"k"', { authorization: "Bearer token-2" }));
    assert.equal(retry.headers.get("idempotent-replayed"), "true");
    assert.equal(runs, 1);
  });

  test("a principal function that names nobody is refused with 500 no-principal; nothing runs", async () => {
    let runs = 0;
    const handler = withIdempotency(() => new Response(`run ${++runs}`), { store: new MemoryStore(), principal: () => undefined });
    const r = await handler(post({ a: 1 }));
    assert.equal(r.status, 500);
    const p = await r.json();
    assert.equal(p.type, "urn:idem:problem:no-principal");
    assert.equal(p.requirement, "IDEM-SCOPE-3");
    assert.equal(runs, 0);
  });
});

test("a principal with a lone surrogate is refused with 500 no-principal, never taken for another's (IDEM-SCOPE-3, IDEM-SCOPE-1)", async () => {
  // "user\ud800" and "user\udc00" (a user id parsed from JSON) would each be "user\ufffd" in
  // the module: one tenant would be replayed the other's answer.
  const runs = [];
  const handler = withIdempotency(async (request) => {
    runs.push(request.headers.get("x-user"));
    return new Response(`secret of ${request.headers.get("x-user")}`, { status: 201 });
  }, { store: new MemoryStore(), principal: (r) => JSON.parse(r.headers.get("x-user")) });
  for (const user of ['"alice\\ud800"', '"alice\\udc00"']) {
    const r = await handler(post({ a: 1 }, '"shared"', { "x-user": user }));
    assert.equal(r.status, 500);
    assert.equal((await r.json()).type, "urn:idem:problem:no-principal");
  }
  assert.deepEqual(runs, []);
  // A well-formed one, U+FFFD itself included, is a principal like any other.
  assert.equal((await handler(post({ a: 1 }, '"shared"', { "x-user": '"alice\\ufffd"' }))).status, 201);
  assert.equal(runs.length, 1);
});

describe("heartbeats and completions (IDEM-LEASE-4)", () => {
  test("a heartbeat still on its way when the handler returns never fences out the completion", async () => {
    for (let round = 0; round < 5; round++) {
      const store = slowStore();
      let runs = 0;
      const handler = withIdempotency(
        async (request) => {
          runs++;
          // The heartbeat is not awaited: its write is still on its way when this returns.
          idempotencyOf(request).extend().catch(() => {});
          return new Response("done", { status: 201 });
        },
        { store, principal: "none", lease: 1000 },
      );
      const key = `"hb-${round}"`;
      assert.equal((await handler(post({ a: 1 }, key))).status, 201);
      const retry = await handler(post({ a: 1 }, key));
      assert.equal(retry.status, 201, "the completion was stored");
      assert.equal(retry.headers.get("idempotent-replayed"), "true");
      assert.equal(runs, 1);
    }
  });

  test("a lease longer than the key retention is refused (IDEM-LEASE-4)", () => {
    assert.throws(
      () => withIdempotency(() => new Response(), { store: new MemoryStore(), principal: "none", keyTtl: 60_000, responseTtl: 60_000, lease: 120_000 }),
      (e) => e instanceof RangeError && e.code === "IDEM-LEASE-4",
    );
  });

  test("a heartbeat carries the key's retention with the lease: the key outlives every live lease", async () => {
    const clock = manualClock();
    const store = new MemoryStore();
    const release = deferred();
    let ctx;
    const handler = withIdempotency(
      async (request) => {
        ctx = idempotencyOf(request);
        await release.promise;
        return new Response("late", { status: 201 });
      },
      { store, principal: "none", responseTtl: 2000, keyTtl: 3000, lease: 2000, now: clock },
    );
    const first = handler(post({ a: 1 }));
    while (ctx === undefined) await tick();
    for (let i = 0; i < 5; i++) {
      clock.advance(1500);
      await ctx.extend();
      store.sweep(clock());
    }
    // 7.5 s in, far past the first key expiry: the key is still held, not new again.
    const dup = await handler(post({ a: 1 }));
    assert.equal(dup.status, 409);
    release.resolve();
    assert.equal((await first).status, 201);
    assert.equal((await handler(post({ a: 1 }))).headers.get("idempotent-replayed"), "true");
  });
});

describe("a handler whose response fails is a failed attempt, not a held key", () => {
  const failures = {
    "a body stream that errors": () =>
      new Response(
        new ReadableStream({
          pull(c) {
            c.error(new Error("upstream reset"));
          },
        }),
        { status: 200 },
      ),
    "something that is not a Response": () => ({ status: 200, body: "not a Response" }),
    "a throw": () => {
      throw new Error("boom");
    },
  };
  for (const [name, make] of Object.entries(failures)) {
    test(`${name}: the retry runs at once as a recovery (IDEM-OUT-3)`, async () => {
      let runs = 0;
      const handler = withIdempotency(
        (request) => {
          runs++;
          return runs === 1 ? make() : new Response(`recovered ${idempotencyOf(request).recovered}`, { status: 201 });
        },
        { store: new MemoryStore(), principal: "none" },
      );
      await assert.rejects(handler(post({ a: 1 })));
      const retry = await handler(post({ a: 1 }));
      assert.equal(retry.status, 201, "not 409 for the rest of a lease");
      assert.equal(await retry.text(), "recovered true");
      assert.equal(runs, 2);
    });
  }
});

test("concurrent refusals each get their own problem: an oversized chunked upload is 413 (IDEM-LIMIT-1)", async () => {
  const handler = withIdempotency(() => new Response("ok"), { store: new MemoryStore(), principal: "none", fingerprint: { maxBody: 1024 } });
  const slowCancel = deferred();
  const upload = new ReadableStream({
    pull(c) {
      c.enqueue(new Uint8Array(512));
    },
    cancel: () => slowCancel.promise,
  });
  const big = handler(
    new Request("http://127.0.0.1/orders", {
      method: "POST",
      headers: { "idempotency-key": '"big"', "content-type": "application/json" },
      body: upload,
      duplex: "half",
    }),
  );
  // While the oversized upload is being cancelled, another request is refused for bad JSON.
  await tick();
  const badJson = await handler(
    new Request("http://127.0.0.1/orders", { method: "POST", headers: { "idempotency-key": '"j"', "content-type": "application/json" }, body: "{" }),
  );
  slowCancel.resolve();
  assert.equal(badJson.status, 400);
  assert.equal((await badJson.json()).type, "urn:idem:problem:invalid-json");
  const r = await big;
  assert.equal(r.status, 413);
  assert.equal((await r.json()).type, "urn:idem:problem:body-too-large");
});

test("idempotentFetch resuming an entry saved after a deterministic refusal reports it rejected (IDEM-CLIENT-2)", async () => {
  const api = withIdempotency(() => Response.json({ error: "card declined" }, { status: 402 }), { store: new MemoryStore(), principal: "none" });
  const server = await serve(api);
  try {
    const saved = new Map();
    const persist = {
      load: (id) => saved.get(id),
      save: (id, bytes) => void saved.set(id, bytes),
      // The process stops before the entry is deleted.
      delete: () => {},
    };
    const first = await idempotentFetch(`${server.url}/orders`, { method: "POST", body: "{}" }, { id: "order-1", persist });
    assert.equal(first.outcome, "rejected");
    const resumed = await idempotentFetch(`${server.url}/orders`, { method: "POST", body: "{}" }, { id: "order-1", persist });
    assert.equal(resumed.outcome, "rejected", "not completed");
    assert.equal(resumed.status, 402);
  } finally {
    await server.close();
  }
});
