// `idem/store-tests`: the rules every store must keep (IDEM-STORE-1, IDEM-STORE-3,
// IDEM-STORE-4, IDEM-STORE-5, IDEM-TTL-1..4, IDEM-LEASE-4, IDEM-STATUS-1..3), as tests to run
// against a store.
// It registers its tests with the `test(name, fn)` function it is given (node:test's, Deno's
// and Bun's all fit) and checks with node:assert (which Node, Deno and Bun all have).
//
// The tests use real time (a store with a time-to-live of its own, like Redis, cannot be
// given a clock), with retention windows of a second or two.
//
// One test per rule of the store contract, each self-contained: the file is as long as the
// contract.
import assert from "node:assert/strict";
import { MemoryStore, idempotencyOf, withIdempotency } from "idem";

const PAUSE = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const HEX = "0123456789abcdef";

/** A key nobody else uses: tests may share a store. */
function uniqueKey(label) {
  let s = "";
  for (let i = 0; i < 16; i++) s += HEX[(Math.random() * 16) | 0];
  return `${label}-${Date.now().toString(36)}-${s}`;
}

/** `n` claims of one idempotency key, as the engine writes them: the storage key, and each
 * claim's write (no record may exist; an in-flight record with a version of its own). Each
 * comes from a request of its own on a scratch MemoryStore. */
async function claimsOf(idemKey, n) {
  let key = null;
  const writes = [];
  for (let i = 0; i < n; i++) {
    const scratch = new MemoryStore();
    let first = true;
    const store = {
      load: (k) => scratch.load(k),
      apply: (k, w, now) => {
        if (first) {
          first = false;
          key = k;
          writes.push(w);
        }
        return scratch.apply(k, w, now);
      },
    };
    await withIdempotency(async () => new Response("ok", { status: 201 }), { store, principal: "none" })(post(idemKey));
  }
  return { key, writes };
}

/** Bytes from a seed, for bodies. */
function bytesOf(n, seed = 1) {
  const out = new Uint8Array(n);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[i] = x & 0xff;
  }
  return out;
}

function post(key, body = '{"amount":100}', path = "/orders") {
  return new Request(`http://store.test${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", "idempotency-key": `"${key}"` },
    body,
  });
}

/** A store whose every call fails, for the outage tests when the caller gives none. */
function failing(store) {
  const fail = async () => {
    const err = new Error("store unavailable (injected by the store tests)");
    err.code = "ECONNREFUSED";
    throw err;
  };
  const out = { load: fail, apply: fail };
  if (typeof store.maxResponseBytes === "number") out.maxResponseBytes = store.maxResponseBytes;
  return out;
}

/**
 * Registers the store tests.
 *
 * - `test(name, fn)`: the test function of your runner.
 * - `name`: the store's name, before each test's.
 * - `open()`: a store (or a promise of one). Called more than once: the concurrency tests
 *   race two stores on the same data (two clients, two pools) when the store is shared.
 * - `outage()`: optional, a store whose backend is down (for example a client pointed at a
 *   port nothing listens on); the tests also inject failures into `open()`'s store.
 * - `shared`: whether two stores from `open()` see the same records (default true).
 * - `selfExpiring`: whether the store deletes expired records on its own (a time-to-live, an
 *   alarm); such a store must have deleted a record once its key expired. A store with
 *   `sweep(now)` is swept by the tests instead.
 * - `maxResponseBytes`: the largest response the store keeps (default: its own
 *   `maxResponseBytes`, else 1 MiB); a response of exactly that size must replay intact.
 */
export function storeTests(test, { name, open, outage, shared = true, selfExpiring = false, maxResponseBytes } = {}) {
  if (typeof test !== "function" || typeof open !== "function") {
    throw new TypeError("storeTests(test, { name, open }) needs the runner's test function and open()");
  }
  const label = (what) => `${name ?? "store"}: ${what}`;

  test(label("apply is a compare-and-set: one of 32 racing claims of a key wins, then one of 31 racing updates (IDEM-STORE-1)"), async () => {
    const stores = shared ? [await open(), await open()] : [await open()];
    for (let round = 0; round < 5; round++) {
      // 32 claims of one key, each made by the engine with a version of its own.
      const { key, writes } = await claimsOf(uniqueKey("cas"), 32);
      const claims = await Promise.all(writes.map((w, i) => stores[i % stores.length].apply(key, w, Date.now())));
      assert.equal(claims.filter((c) => c === true).length, 1, `round ${round}: claims ${claims}`);
      const winner = writes[claims.indexOf(true)];
      const stored = await stores[0].load(key);
      assert.equal(stored.version, winner.version);
      assert.deepEqual(stored.value, winner.value);
      // The 31 other records written over the winner's version (each with a version of its
      // own, as every engine write has): one wins, the others change nothing.
      const updates = writes.filter((w) => w !== winner).map((w) => ({ ...w, expect: winner.version }));
      const done = await Promise.all(updates.map((w, i) => stores[(i + 1) % stores.length].apply(key, w, Date.now())));
      assert.equal(done.filter((c) => c === true).length, 1, `round ${round}: updates ${done}`);
      const after = await stores[stores.length - 1].load(key);
      assert.equal(after.version, updates[done.indexOf(true)].version);
      // 16 writes the same to the byte over one version, as two takeovers of one lease in the
      // same millisecond make: one is made, whatever they have in common.
      const same = { ...writes.find((w) => w.version !== after.version), expect: after.version };
      const copies = await Promise.all(Array.from({ length: 16 }, (_, i) => stores[i % stores.length].apply(key, { ...same }, Date.now())));
      assert.equal(copies.filter((c) => c === true).length, 1, `round ${round}: identical updates ${copies}`);
    }
  });

  test(label("versions: a write with a stale or missing version changes nothing; a delete needs the version too"), async () => {
    const store = await open();
    const { key, writes } = await claimsOf(uniqueKey("ver"), 3);
    const [a, b, c] = writes;
    const other = (v) => (v === "1" ? "2" : "1");
    assert.equal(await store.load(key), null);
    assert.equal(await store.apply(key, { ...b, expect: other(b.version) }, Date.now()), false);
    assert.equal(await store.load(key), null, "an update of a missing record must not create it");
    assert.equal(await store.apply(key, a, Date.now()), true);
    assert.equal(await store.apply(key, b, Date.now()), false, "a claim over a record must fail");
    assert.equal((await store.load(key)).version, a.version);
    assert.equal(await store.apply(key, { ...b, expect: other(a.version) }, Date.now()), false);
    assert.equal(await store.apply(key, { ...b, expect: a.version }, Date.now()), true);
    const now = await store.load(key);
    assert.equal(now.version, b.version);
    assert.deepEqual(now.value, b.value);
    const remove = (expect) => ({ expect, value: null, version: "", deadline: 0, expires: 0 });
    assert.equal(await store.apply(key, remove(a.version), Date.now()), false);
    assert.notEqual(await store.load(key), null);
    assert.equal(await store.apply(key, remove(b.version), Date.now()), true);
    assert.equal(await store.load(key), null);
    // A key deleted is new again.
    assert.equal(await store.apply(key, c, Date.now()), true);
    assert.equal((await store.load(key)).version, c.version);
  });

  test(label("32 concurrent duplicates through withIdempotency run the handler once, and the retries replay it (IDEM-CONC-1)"), async () => {
    const stores = shared ? [await open(), await open()] : [await open()];
    let runs = 0;
    const handlers = stores.map((store) =>
      withIdempotency(
        async (request) => {
          runs++;
          await PAUSE(30);
          return Response.json({ run: runs, got: await request.json() }, { status: 201 });
        },
        { store, principal: "none" },
      ),
    );
    for (let round = 0; round < 3; round++) {
      const key = uniqueKey("dup");
      const before = runs;
      const answers = await Promise.all(Array.from({ length: 32 }, (_, i) => handlers[i % handlers.length](post(key))));
      assert.equal(runs - before, 1, `round ${round}: ${runs - before} executions`);
      for (const a of answers) assert.ok(a.status === 201 || a.status === 409, `status ${a.status}`);
      const retry = await handlers[0](post(key));
      assert.equal(retry.status, 201);
      assert.equal(retry.headers.get("idempotent-replayed"), "true");
      assert.equal(runs - before, 1);
    }
  });

  test(label("a status query tells what became of a key in the asker's scope, and a settle racing the original lets exactly one of them win (IDEM-STATUS-1, IDEM-STATUS-2, IDEM-STATUS-3)"), async () => {
    const stores = shared ? [await open(), await open()] : [await open()];
    let runs = 0;
    const handlers = stores.map((store) =>
      withIdempotency(
        async (request) => {
          runs++;
          await request.json();
          return Response.json({ run: runs }, { status: 201 });
        },
        { store, principal: (request) => request.headers.get("x-user") ?? "alice" },
      ),
    );
    const ask = async (handler, key, field, who = "alice") => {
      const answer = await handler(
        new Request("http://store.test/orders", {
          headers: { "idempotency-key": `"${key}"`, "idempotency-status": field, "x-user": who },
        }),
      );
      assert.equal(answer.status, 200, await answer.clone().text());
      assert.equal(answer.headers.get("content-type"), "application/vnd.idem.key-status+json");
      return answer.json();
    };
    const key = uniqueKey("status");
    assert.equal((await ask(handlers[0], key, "POST")).status, "unknown");
    assert.equal((await handlers[0](post(key))).status, 201);
    const done = await ask(handlers[handlers.length - 1], key, "POST");
    assert.deepEqual(done, { key, response: { replayable: true, status: 201 }, status: "completed" });
    // Another principal's key is unknown to the asker, and a settle stays in the asker's scope.
    assert.equal((await ask(handlers[0], key, "POST; settle", "bob")).status, "not-executed");
    assert.equal((await handlers[0](post(key))).headers.get("idempotent-replayed"), "true");
    const before = runs;
    let settled = 0;
    for (let round = 0; round < 16; round++) {
      // The settle and the original released together, through different stores.
      const raced = uniqueKey("settle-race");
      const [query, original] = await Promise.all([
        ask(handlers[round % handlers.length], raced, "POST; settle"),
        handlers[(round + 1) % handlers.length](post(raced)),
      ]);
      const ran = original.status === 201;
      if (query.status === "not-executed") {
        settled++;
        assert.equal(ran, false, `round ${round}: settled and executed`);
        assert.equal(original.status, 409);
        assert.equal((await original.json()).type, "urn:idem:problem:key-settled");
      } else {
        assert.equal(ran, true, `round ${round}: neither settled nor executed (${query.status}, ${original.status})`);
        assert.ok(query.status === "in-progress" || query.status === "completed", query.status);
      }
      // Asked again, it says the same.
      assert.equal((await ask(handlers[0], raced, "POST")).status, ran ? "completed" : "not-executed");
    }
    assert.equal(runs - before, 16 - settled, "each original ran at most once");
  });

  test(label("deadlines and expiry: the response replays until it expires, then 410 while the key lives, then the key is new (IDEM-TTL-1, IDEM-TTL-2, IDEM-TTL-3, IDEM-TTL-4)"), async () => {
    const store = await open();
    const responseTtl = 700;
    const keyTtl = 1800;
    let runs = 0;
    const handler = withIdempotency(
      async () => {
        runs++;
        // A body large enough that dropping it shows.
        return new Response("x".repeat(16 * 1024), { status: 201 });
      },
      { store, principal: "none", responseTtl, keyTtl, lease: 500 },
    );
    const key = uniqueKey("ttl");
    const start = Date.now();
    assert.equal((await handler(post(key))).status, 201);
    assert.equal((await handler(post(key))).headers.get("idempotent-replayed"), "true");
    await PAUSE(start + responseTtl + 150 - Date.now());
    if (typeof store.sweep === "function") await store.sweep(Date.now());
    const gone = await handler(post(key));
    assert.equal(gone.status, 410, "a retry after the response expired must get 410, not run again");
    assert.equal(runs, 1);
    await PAUSE(start + keyTtl + 300 - Date.now());
    if (typeof store.sweep === "function") await store.sweep(Date.now());
    const fresh = await handler(post(key));
    assert.equal(fresh.status, 201, "after the key expired it is new again");
    assert.equal(fresh.headers.get("idempotent-replayed"), null);
    assert.equal(runs, 2);
  });

  test(label("the store keeps the record until its key expires, and holds it as a tombstone once the response expired (IDEM-STORE-6, IDEM-STORE-9)"), async () => {
    const store = await open();
    const responseTtl = 600;
    const keyTtl = 1600;
    const captured = capture(store);
    const handler = withIdempotency(async () => new Response("y".repeat(32 * 1024), { status: 201 }), {
      store: captured,
      principal: "none",
      responseTtl,
      keyTtl,
      lease: 400,
    });
    const start = Date.now();
    assert.equal((await handler(post(uniqueKey("tomb")))).status, 201);
    const key = captured.last();
    const full = await store.load(key);
    assert.ok(full.value.byteLength > 32 * 1024, "the completed record holds the response");
    // Every write carries its deadlines: the response's expiry first, then the key's.
    const write = captured.lastWrite();
    assert.ok(write.deadline >= start + responseTtl && write.deadline < start + keyTtl, `deadline ${write.deadline - start}`);
    assert.ok(write.expires >= start + keyTtl, `expires ${write.expires - start}: a store's time-to-live is the key's, never the response's`);
    await PAUSE(start + responseTtl + 200 - Date.now());
    if (typeof store.sweep === "function") {
      await store.sweep(Date.now());
      const tomb = await store.load(key);
      assert.ok(tomb !== null, "a sweep after the response expired keeps the key");
      assert.ok(tomb.value.byteLength < 1024, `a sweep turns the record into a tombstone (${tomb.value.byteLength} bytes)`);
    } else {
      // A store that expires records itself drops the response when it expires, not with
      // the key (IDEM-STORE-9): by the key's end at the latest, however late its timer (an
      // alarm on a loaded machine) fires.
      let held = await store.load(key);
      while (selfExpiring && held !== null && held.value.byteLength >= 1024 && Date.now() < start + keyTtl - 300) {
        await PAUSE(50);
        held = await store.load(key);
      }
      assert.ok(held !== null, "the record outlives its response");
      if (selfExpiring) assert.ok(held.value.byteLength < 1024, `the response is still held (${held.value.byteLength} bytes)`);
    }
    await PAUSE(start + keyTtl + 400 - Date.now());
    if (typeof store.sweep === "function") await store.sweep(Date.now());
    // A store that expires records itself (a time-to-live, an alarm) has deleted it now.
    if (selfExpiring || typeof store.sweep === "function") assert.equal(await store.load(key), null);
  });

  test(label("a record in flight is kept past its key's retention while its lease lives (IDEM-STORE-3, IDEM-LEASE-4)"), async () => {
    const store = await open();
    // The heartbeat comes half-way through the lease, and the duplicate a quarter of a
    // second after the key's retention, three quarters of a second before the extended lease
    // ends: margins a loaded machine (a Durable Object over RPC, tests side by side) keeps.
    const keyTtl = 2000;
    const lease = 2000;
    let release;
    const held = new Promise((resolve) => (release = resolve));
    let runs = 0;
    const handler = withIdempotency(
      async (request) => {
        runs++;
        await PAUSE(1000);
        await idempotencyOf(request).extend();
        await held;
        return new Response("done", { status: 201 });
      },
      { store, principal: "none", responseTtl: keyTtl, keyTtl, lease },
    );
    const key = uniqueKey("lease");
    const start = Date.now();
    const first = handler(post(key));
    await PAUSE(start + keyTtl + 250 - Date.now());
    if (typeof store.sweep === "function") await store.sweep(Date.now());
    const dup = await handler(post(key));
    assert.equal(dup.status, 409, "a duplicate while the lease lives is refused, even after the key's first retention");
    assert.equal(runs, 1);
    release();
    assert.equal((await first).status, 201);
    const retry = await handler(post(key));
    assert.equal(retry.headers.get("idempotent-replayed"), "true");
    assert.equal(runs, 1);
  });

  test(label("a store that fails answers 503 problem+json and runs nothing (IDEM-STORE-4)"), async () => {
    const store = await open();
    const broken = [failing(store)];
    if (typeof outage === "function") broken.push(await outage());
    for (const down of broken) {
      let runs = 0;
      const handler = withIdempotency(
        async () => {
          runs++;
          return new Response("ran", { status: 201 });
        },
        { store: down, principal: "none" },
      );
      const answer = await handler(post(uniqueKey("down")));
      assert.equal(answer.status, 503);
      assert.equal(answer.headers.get("content-type"), "application/problem+json");
      const problem = await answer.json();
      assert.match(problem.type, /store-unavailable/);
      assert.equal(runs, 0);
    }
    // A store that fails only on the completion: the handler ran once; the retry must not
    // run it again while the lease lives.
    let runs = 0;
    let failCompletion = true;
    const flaky = {
      load: (k) => store.load(k),
      apply: async (k, w, now) => {
        if (w.expect !== null && failCompletion) {
          failCompletion = false;
          throw new Error("store unavailable (injected)");
        }
        return store.apply(k, w, now);
      },
    };
    const handler = withIdempotency(
      async () => {
        runs++;
        return new Response("ran", { status: 201 });
      },
      { store: flaky, principal: "none", lease: 5_000 },
    );
    const key = uniqueKey("flaky");
    await handler(post(key));
    const retry = await handler(post(key));
    assert.equal(runs, 1, "a retry after a failed completion must not run again while the lease lives");
    assert.ok(retry.status === 409 || retry.status === 503, `status ${retry.status}`);
  });

  test(label("values up to the size limit replay byte for byte; a larger response is kept as response-not-stored (IDEM-STORE-5)"), async () => {
    const store = await open();
    const limit = maxResponseBytes ?? store.maxResponseBytes ?? 1 << 20;
    let runs = 0;
    // The limit counts the response's headers with its body.
    const body = bytesOf(limit - 256, 99);
    const handler = withIdempotency(
      async (request) => {
        runs++;
        const big = new URL(request.url).searchParams.get("over") === "1";
        return new Response(big ? bytesOf(limit + 1, 5) : body, { status: 200, headers: { "content-type": "application/octet-stream" } });
      },
      { store, principal: "none", maxResponseBytes: limit },
    );
    const key = uniqueKey("big");
    const first = new Uint8Array(await (await handler(post(key))).arrayBuffer());
    assert.equal(first.byteLength, body.byteLength);
    const replay = await handler(post(key));
    assert.equal(replay.headers.get("idempotent-replayed"), "true");
    const again = new Uint8Array(await replay.arrayBuffer());
    assert.equal(again.byteLength, body.byteLength);
    assert.ok(again.every((b, i) => b === body[i]), "the replayed body differs");
    const over = uniqueKey("over");
    const path = "/orders?over=1";
    assert.equal((await handler(post(over, undefined, path))).status, 200);
    const refused = await handler(post(over, undefined, path));
    assert.equal(refused.status, 410);
    assert.match((await refused.json()).type, /response-not-stored/);
    assert.equal(runs, 2);
  });
}

/** A store wrapper that remembers the last key and write, for the tests that look inside. */
function capture(store) {
  let key = null;
  let write = null;
  const out = {
    load: (k) => store.load(k),
    apply: (k, w, now, info) => {
      key = k;
      write = w;
      return store.apply(k, w, now, info);
    },
    last: () => key,
    lastWrite: () => write,
  };
  if (typeof store.maxResponseBytes === "number") out.maxResponseBytes = store.maxResponseBytes;
  return out;
}
