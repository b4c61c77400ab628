// The Durable Object store (DurableObjectStore and its IdempotencyShard objects), against an
// in-memory fake of the Durable Object storage API; DurableObjectLocalStore's own tests are
// in local-store.test.mjs.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { DurableObjectLocalStore, DurableObjectStore, IdempotencyShard, withIdempotency } from "idem";
import { FakeNamespace, FakeStorage, barrier, manualClock, postOrder as post } from "./helpers.mjs";

function worker(options = {}) {
  const namespace = options.namespace ?? new FakeNamespace(IdempotencyShard, options.storage);
  const state = { executions: 0 };
  const handler = withIdempotency(
    async (request) => {
      state.executions++;
      await request.json();
      if (options.gate) await options.gate();
      return options.respond ? options.respond(state.executions) : new Response(`order ${state.executions}`, { status: 201 });
    },
    { principal: "none", store: new DurableObjectStore(namespace), ...options.idem },
  );
  return { namespace, handler, state };
}

describe("Durable Object store", () => {
  test("claims, replays and mismatches through the shard objects", async () => {
    const { namespace, handler, state } = worker();
    assert.equal((await handler(post('"a"'))).status, 201);
    const replay = await handler(post('"a"'));
    assert.equal(replay.headers.get("idempotent-replayed"), "true");
    assert.equal(await replay.text(), "order 1");
    assert.equal((await handler(post('"a"', { amount: 2 }))).status, 422);
    for (let i = 0; i < 20; i++) await handler(post(`"k${i}"`));
    assert.equal(state.executions, 21);
    assert.ok(namespace.objects.size > 1, "keys spread over several shards");
  });

  test("concurrent duplicates through one shard: the claim is made before any other await (IDEM-JS-3)", async () => {
    for (let round = 0; round < 5; round++) {
      const gate = barrier();
      const { handler, state } = worker({ gate: () => gate.wait() });
      const all = Array.from({ length: 32 }, () => handler(post(`"dup-${round}"`)));
      await new Promise((resolve) => setTimeout(resolve, 20));
      gate.open();
      const statuses = (await Promise.all(all)).map((r) => r.status);
      assert.equal(state.executions, 1);
      assert.equal(statuses.filter((s) => s === 201).length, 1);
      assert.equal(statuses.filter((s) => s === 409).length, 31);
    }
  });

  test("records survive the object's restart (memory lost, storage kept)", async () => {
    const { namespace, handler, state } = worker();
    await handler(post('"persist"'));
    namespace.restart();
    const again = await handler(post('"persist"'));
    assert.equal(again.headers.get("idempotent-replayed"), "true");
    assert.equal(state.executions, 1);
  });

  test("concurrent claims in one object after a restart both read storage, and only one wins", async () => {
    const { namespace, handler, state } = worker();
    await handler(post('"warm"'));
    namespace.restart();
    const gate = barrier();
    const w = worker({ gate: () => gate.wait() });
    w.namespace.objects = namespace.objects;
    const all = Array.from({ length: 8 }, () => w.handler(post('"cold"')));
    await new Promise((resolve) => setTimeout(resolve, 20));
    gate.open();
    const statuses = (await Promise.all(all)).map((r) => r.status);
    assert.equal(w.state.executions, 1);
    assert.equal(statuses.filter((s) => s === 201).length, 1);
    assert.equal(state.executions, 1);
  });

  test("alarms drive expiry from each record's deadline (IDEM-TTL-4)", async () => {
    const clock = manualClock(Date.now());
    const { namespace, handler, state } = worker({ idem: { responseTtl: 1000, keyTtl: 3000, lease: 1000, now: clock } });
    await handler(post('"exp"'));
    const [entry] = [...namespace.objects.values()].filter((e) => e.storage.alarm !== null);
    assert.ok(entry, "an alarm was set");
    assert.equal(entry.storage.alarm, clock() + 1000);
    // The alarm fires at the response deadline: the record becomes a tombstone.
    const realNow = Date.now;
    try {
      Date.now = () => clock() + 1000;
      await entry.object.alarm();
      const gone = await handler(post('"exp"'));
      assert.equal(gone.status, 410); // served from the tombstone
      assert.equal(entry.storage.alarm, clock() + 3000);
      Date.now = () => clock() + 3000;
      await entry.object.alarm();
    } finally {
      Date.now = realNow;
    }
    const records = [...entry.storage.map.keys()].filter((k) => k.startsWith("r:"));
    assert.deepEqual(records, []);
    assert.equal(entry.storage.alarm, null);
    clock.advance(3000);
    assert.equal((await handler(post('"exp"'))).status, 201);
    assert.equal(state.executions, 2);
  });

  test("a record that does not decode expires at its key retention, and does not hold back the records due after it (IDEM-TTL-4, IDEM-REC-1)", async () => {
    const clock = manualClock(Date.now());
    // One object: every record in the same storage.
    const namespace = new FakeNamespace(IdempotencyShard);
    const one = { idFromName: () => ({ name: "the-shard" }), get: (id) => namespace.get(id) };
    const handler = withIdempotency(async () => new Response("ok", { status: 201 }), {
      principal: "none",
      store: new DurableObjectStore(one),
      responseTtl: 1000,
      keyTtl: 3000,
      lease: 1000,
      now: clock,
    });
    for (const key of ['"a"', '"b"', '"c"']) assert.equal((await handler(post(key))).status, 201);
    const [entry] = [...namespace.objects.values()];
    const records = () => [...entry.storage.map.keys()].filter((k) => k.startsWith("r:")).sort();
    assert.equal(records().length, 3);
    // The first record's bytes become ones this version does not read, in a fresh object.
    entry.storage.map.get(records()[0]).value = new Uint8Array([0xff, 1, 2, 3]);
    entry.object = new IdempotencyShard({ storage: entry.storage }, {});
    const realNow = Date.now;
    try {
      Date.now = () => clock() + 1000;
      await entry.object.alarm();
      assert.equal(records().length, 3, "the damaged record waits for its key retention");
      assert.equal(entry.storage.alarm, clock() + 3000);
      Date.now = () => clock() + 3000;
      await entry.object.alarm();
    } finally {
      Date.now = realNow;
    }
    assert.deepEqual(records(), []);
    assert.equal(entry.storage.alarm, null);
  });

  test("damaged wire bytes are refused and claim nothing (IDEM-JS-2)", async () => {
    const shard = new IdempotencyShard({ storage: new (await import("./helpers.mjs")).FakeStorage() });
    await assert.rejects(
      shard.claim(new Uint8Array([0x41, 0xff, 0xff]), "{}", Date.now(), 1, 2),
      (e) => e instanceof RangeError && e.code === "IDEM-JS-2",
    );
    const response = await shard.fetch(
      new Request("https://idem-shard.invalid/claim", { method: "POST", body: new Uint8Array([1, 2, 3]), headers: { "x-idem-now": "1" } }),
    );
    assert.equal(response.status, 400);
    assert.equal(response.headers.get("x-idem-code"), "IDEM-JS-2");
  });

  test("a message whose time is missing or not one is refused and claims nothing (IDEM-JS-2)", async () => {
    const shard = new IdempotencyShard({ storage: new FakeStorage() });
    const message = (path, headers) => new Request(`https://idem-shard.invalid${path}`, { method: "POST", body: new Uint8Array([1]), headers });
    for (const now of [undefined, "", " ", "abc", "1e400", "-5", "NaN"]) {
      const headers = now === undefined ? {} : { "x-idem-now": now };
      for (const response of [
        await shard.fetch(message("/claim", headers)),
        await shard.fetch(message("/apply", { ...headers, "x-idem-key": "k", "x-idem-version": "1", "x-idem-deadline": "5" })),
        await shard.fetch(message("/apply", { "x-idem-now": "1", "x-idem-key": "k", "x-idem-version": "1", "x-idem-deadline": now ?? "" })),
        await shard.fetch(message("/apply", { "x-idem-now": "1", "x-idem-key": "k", "x-idem-version": "1", "x-idem-deadline": "5", "x-idem-expires": now ?? "" })),
      ]) {
        assert.equal(response.status, 400, `x-idem time ${JSON.stringify(now)}`);
        assert.equal(response.headers.get("x-idem-code"), "IDEM-JS-2");
      }
    }
    // Nothing was written.
    assert.equal(await shard.load("k"), null);
  });

  test("a store that cannot be reached answers 503 and runs nothing (IDEM-STORE-4)", async () => {
    let executions = 0;
    const broken = { idFromName: (n) => n, get: () => ({ fetch: async () => new Response("boom", { status: 500 }) }) };
    const handler = withIdempotency(
      () => {
        executions++;
        return new Response("x");
      },
      { principal: "none", store: new DurableObjectStore(broken) },
    );
    const r = await handler(post('"z"'));
    assert.equal(r.status, 503);
    assert.equal(executions, 0);
  });

  test("an object that does not answer fails the call in time: 503, nothing runs (IDEM-STORE-10)", async () => {
    let executions = 0;
    const stuck = { idFromName: (n) => n, get: () => ({ fetch: () => new Promise(() => {}) }) };
    const handler = withIdempotency(
      () => {
        executions++;
        return new Response("x");
      },
      { principal: "none", store: new DurableObjectStore(stuck, { timeout: 200 }) },
    );
    const start = Date.now();
    // The claim's call, then the call that withdraws what it may have written (IDEM-STORE-12).
    const bound = 2 * 200 + 1_000;
    const r = await Promise.race([handler(post('"stuck"')), new Promise((resolve) => setTimeout(() => resolve(null), bound + 2_000))]);
    assert.ok(r !== null, "no answer");
    assert.equal(r.status, 503);
    assert.equal((await r.json()).type, "urn:idem:problem:store-unavailable");
    assert.ok(Date.now() - start < bound);
    assert.equal(executions, 0);
  });

  test("a claim the object made whose answer is lost is withdrawn before the 503: the retry runs at once, once (IDEM-STORE-12)", async () => {
    const namespace = new FakeNamespace(IdempotencyShard);
    let lose = true;
    const get = namespace.get.bind(namespace);
    namespace.get = (id) => {
      const stub = get(id);
      return {
        fetch: async (input, init) => {
          const response = await stub.fetch(input, init);
          // The object committed the claim; its answer never reaches the worker.
          if (lose && String(input).endsWith("/claim")) {
            lose = false;
            throw new Error("Network connection lost.");
          }
          return response;
        },
      };
    };
    const { handler, state } = worker({ namespace });
    const refused = await handler(post('"lost"'));
    assert.equal(refused.status, 503);
    assert.equal(state.executions, 0);
    const retry = await handler(post('"lost"'));
    assert.equal(retry.status, 201, "the late claim holds the key");
    assert.equal(await retry.text(), "order 1");
    assert.equal(state.executions, 1);
  });

  test("the store needs a namespace binding (IDEM-JS-1)", () => {
    assert.throws(() => new DurableObjectStore({}), (e) => e instanceof RangeError && e.code === "IDEM-JS-1");
  });

  test("two claims whose storage reads settle together: only one runs (IDEM-EXEC-1, IDEM-JS-3)", async () => {
    // The fake storage answers reads issued in the same turn together, from snapshots taken
    // when they were issued, as a real storage under load may. Each round starts on a cold
    // object, so every claim reads storage.
    for (let round = 0; round < 10; round++) {
      const gate = barrier();
      const { handler, state } = worker({ gate: () => gate.wait() });
      const all = Array.from({ length: 8 }, () => handler(post(`"cold-${round}"`)));
      await new Promise((resolve) => setTimeout(resolve, 20));
      gate.open();
      const statuses = (await Promise.all(all)).map((r) => r.status);
      assert.equal(state.executions, 1, `round ${round}: one execution`);
      assert.deepEqual(
        statuses.sort(),
        [201, 409, 409, 409, 409, 409, 409, 409],
      );
    }
  });

  for (const backend of ["kv", "sqlite"]) {
    test(`responses past one storage value are kept whole, and past the limit held, never run again (${backend} backend, IDEM-STORE-5)`, async () => {
      const big = (size, n) => new Uint8Array(size).map((_, i) => (i * 7 + n) % 251);
      // Three megabytes are more than one put of a SQLite-backed object takes.
      const sizes = { "one-mb": 1 << 20, "three-mb": 3 << 20 };
      const { handler, state } = worker({
        storage: { backend },
        respond: (n) => new Response(big(sizes[order], n), { status: 200, headers: { "x-n": String(n) } }),
      });
      let order;
      for (order of Object.keys(sizes)) {
        const first = await handler(post(`"${order}"`));
        assert.equal(first.status, 200);
        assert.equal((await first.arrayBuffer()).byteLength, sizes[order], "the first answer is the handler's");
        const again = await handler(post(`"${order}"`));
        assert.equal(again.headers.get("idempotent-replayed"), "true");
        const body = new Uint8Array(await again.arrayBuffer());
        if (order === "three-mb") {
          assert.equal(again.status, 410);
          assert.equal(JSON.parse(new TextDecoder().decode(body)).type, "urn:idem:problem:response-not-stored");
        } else {
          assert.equal(again.status, 200);
          assert.deepEqual(body, big(sizes[order], state.executions));
        }
      }
      assert.equal(state.executions, 2, "no retry ran again");
    });
  }

  test("a record evicted from the object's memory while a claim waited is read again, never taken for absent (IDEM-EXEC-1, IDEM-JS-3)", async () => {
    for (const backend of ["sqlite", "kv"]) {
      // Every key on one object, as many keys over few shards put 10,000 on each.
      const shard = new IdempotencyShard({ storage: new FakeStorage({ backend }) }, {});
      const namespace = { idFromName: (name) => ({ name }), get: () => ({ fetch: (input, init) => shard.fetch(new Request(input, init)) }) };
      const { handler, state } = worker({ namespace });
      assert.equal((await handler(post('"K"'))).status, 201);
      // The object reads other keys until its memory of records is full.
      for (let i = 0; i < 9_999; i++) await shard.load(`other-${i}`);
      // A late retry of K and a new key arrive together: the new key's read evicts K's.
      const [k, x] = await Promise.all([handler(post('"K"')), handler(post('"X"'))]);
      assert.equal(k.headers.get("idempotent-replayed"), "true", `${backend}: the retry ran again`);
      assert.equal(await k.text(), "order 1");
      assert.equal(x.status, 201);
      assert.equal(state.executions, 2, backend);
    }
  });

  test("under the wait policy the worker waits and the object answers at once: the duplicate gets the replay (IDEM-CONC-2)", async () => {
    const gate = barrier();
    const { handler, state } = worker({ gate: () => gate.wait(), idem: { inFlight: { wait: 2000, poll: 10 } } });
    const first = handler(post('"waited"'));
    await new Promise((resolve) => setTimeout(resolve, 20));
    const second = handler(post('"waited"'));
    await new Promise((resolve) => setTimeout(resolve, 50));
    gate.open();
    assert.equal((await first).status, 201);
    const replay = await second;
    assert.equal(replay.status, 201);
    assert.equal(replay.headers.get("idempotent-replayed"), "true");
    assert.equal(state.executions, 1);
  });

  test("the placement of a key depends on the key alone, and settings that would move keys are refused", async () => {
    assert.throws(
      () => new DurableObjectStore(new FakeNamespace(IdempotencyShard), { shards: 16 }),
      (e) => e instanceof RangeError && e.code === "IDEM-JS-1" && /never sends a retry/.test(e.message),
    );
    // A call's time bound is the one setting: it moves no key.
    assert.equal(new DurableObjectStore(new FakeNamespace(IdempotencyShard), { timeout: 500 }).maxResponseBytes > 0, true);
    for (const timeout of [0, -1, 1.5, "100"]) {
      assert.throws(() => new DurableObjectStore(new FakeNamespace(IdempotencyShard), { timeout }), (e) => e.code === "IDEM-JS-1" && /options.timeout/.test(e.message));
    }
    // Pinned: these names must never change, or deployed keys would move.
    const { namespace, handler } = worker();
    for (const key of ["a", "b", "order-1"]) await handler(post(`"${key}"`));
    assert.deepEqual([...namespace.objects.keys()].sort(), ["idem-112", "idem-188", "idem-41"]);
  });
});


describe("sealed records in Durable Object storage (IDEM-SEAL-1..3)", () => {
  const SECRET = "Ada Lovelace, 12 St James's Square";
  const key = (byte) => new Uint8Array(32).fill(byte);
  const OLD = { id: "2026-05", key: key(1) };
  const NEW = { id: "2026-11", key: key(2) };
  /** The shard class a worker exports to seal with `keys` (none: no seal). */
  const shardWith = (keys) =>
    class extends IdempotencyShard {
      constructor(state, env) {
        super(state, env, keys === undefined ? {} : { seal: { keys } });
      }
    };
  /** Every byte the objects' storage holds, values and chunks. */
  const dump = (namespace) => {
    const out = [];
    for (const { storage } of namespace.objects.values()) {
      for (const [k, v] of storage.map) {
        out.push(Buffer.from(k));
        if (v instanceof Uint8Array) out.push(Buffer.from(v));
        else if (v?.value instanceof Uint8Array) out.push(Buffer.from(v.value));
      }
    }
    return out;
  };
  const inClear = (values, needle) => values.some((v) => v.includes(needle));
  const sealedWorker = (keys, options = {}) => {
    const w = worker({ ...options, respond: (n) => Response.json({ order: n, ship_to: SECRET }, { status: 201, headers: { "x-card-last4": "card-4242" } }) });
    w.namespace.Class = shardWith(keys);
    w.namespace.restart();
    return w;
  };
  const rotate = (namespace, keys) => {
    namespace.Class = shardWith(keys);
    namespace.restart();
  };

  test("sealed in storage, replayed after a restart, nothing of the response in clear", async () => {
    const { namespace, handler, state } = sealedWorker([OLD]);
    const first = await handler(post('"a"', { sku: "fountain-pen" }));
    assert.equal(first.status, 201);
    const body = await first.text();
    rotate(namespace, [OLD]);
    const again = await handler(post('"a"', { sku: "fountain-pen" }));
    assert.deepEqual([again.headers.get("idempotent-replayed"), await again.text()], ["true", body]);
    assert.equal(state.executions, 1);
    const values = dump(namespace);
    for (const clear of [SECRET, "card-4242", "x-card-last4", "fountain-pen"]) assert.ok(!inClear(values, clear), `${clear} is stored in clear`);
    const record = [...namespace.objects.values()].flatMap(({ storage }) => [...storage.map.values()]).find((v) => v?.value instanceof Uint8Array);
    assert.equal(Buffer.from(record.value.subarray(0, 2)).toString(), "iS");
  });

  test("keys rotate; a record under a dropped key, or in a store with none, is refused and never run", async () => {
    const { namespace, handler, state } = sealedWorker([OLD]);
    const a = await (await handler(post('"a"'))).text();
    rotate(namespace, [NEW, OLD]);
    assert.equal(await (await handler(post('"a"'))).text(), a);
    const b = await (await handler(post('"b"'))).text();
    rotate(namespace, [NEW]);
    assert.equal(await (await handler(post('"b"'))).text(), b);
    const refused = await handler(post('"a"'));
    assert.equal(refused.status, 500);
    assert.equal((await refused.json()).type, "urn:idem:problem:record-sealed");
    rotate(namespace, undefined);
    assert.equal((await (await handler(post('"b"'))).json()).type, "urn:idem:problem:record-sealed");
    assert.equal(state.executions, 2);
  });

  test("a due record under a dropped key is due again when it need no longer be kept, and deleted then (IDEM-SEAL-3)", async () => {
    const clock = manualClock(Date.now());
    const { namespace, handler } = sealedWorker([OLD], { idem: { responseTtl: 1000, keyTtl: 3000, lease: 1000, now: clock } });
    assert.equal((await handler(post('"gone"'))).status, 201);
    rotate(namespace, [NEW]);
    const [entry] = [...namespace.objects.values()].filter((e) => e.storage.alarm !== null);
    const keys = () => [...entry.storage.map.keys()].filter((k) => /^[rcd]:/.test(k)).sort();
    const t0 = clock();
    assert.equal(entry.storage.alarm, t0 + 1000, "due at the response's expiry");
    const realNow = Date.now;
    try {
      // At the response's expiry the record cannot be opened to expire its response: it is
      // due again when the key's retention ends, and stays until then.
      Date.now = () => t0 + 1000;
      await entry.object.alarm();
      assert.equal(entry.storage.alarm, t0 + 3000);
      const records = keys().filter((k) => k.startsWith("r:"));
      assert.equal(records.length, 1, "the record stays while it must be kept");
      assert.deepEqual(keys().filter((k) => k.startsWith("d:")), [`d:${String(t0 + 3000).padStart(16, "0")}:${records[0].slice(2)}`]);
      // Then it is deleted without being read, and nothing is left due.
      Date.now = () => t0 + 3000;
      await entry.object.alarm();
    } finally {
      Date.now = realNow;
    }
    assert.deepEqual(keys(), []);
    assert.equal(entry.storage.alarm, null);
  });

  test("a sealed record copied under another key does not open there", async () => {
    const storage = new FakeStorage();
    let executions = 0;
    const handler = withIdempotency(
      async () => {
        executions++;
        return Response.json({ ship_to: SECRET }, { status: 201 });
      },
      { principal: "none", store: new DurableObjectLocalStore({ storage }, { seal: { keys: [OLD] } }) },
    );
    await handler(post('"from"'));
    const from = [...storage.map.keys()].find((k) => k.startsWith("idem:r:") && k.endsWith("from"));
    storage.map.set(`${from.slice(0, -"from".length)}to`, structuredClone(storage.map.get(from)));
    const refused = await handler(post('"to"'));
    assert.equal(refused.status, 500);
    assert.equal((await refused.json()).type, "urn:idem:problem:record-sealed");
    assert.equal(executions, 1);
  });

  test("racing duplicates on sealed records: one execution, and storage ends with the completed record", async () => {
    for (let round = 0; round < 5; round++) {
      const gate = barrier();
      const { namespace, handler, state } = sealedWorker([OLD], { gate: () => gate.wait() });
      const all = Array.from({ length: 16 }, () => handler(post(`"dup-${round}"`)));
      await new Promise((resolve) => setTimeout(resolve, 20));
      gate.open();
      const statuses = (await Promise.all(all)).map((r) => r.status);
      assert.equal(state.executions, 1);
      assert.equal(statuses.filter((s) => s === 201).length, 1);
      // The claim's put and the completion's were put in order: storage replays.
      rotate(namespace, [OLD]);
      assert.equal((await handler(post(`"dup-${round}"`))).headers.get("idempotent-replayed"), "true");
    }
  });

  test("sealed writes reach storage in the order the object took them, however long each seal takes", async () => {
    const storage = new FakeStorage();
    const Sealed = shardWith([OLD]);
    const shard = new Sealed({ storage }, {});
    // The first write is large (its seal takes longer), the second small: both are taken at
    // once, and storage must end with the second.
    const large = new Uint8Array(3 << 19).fill(7);
    const small = new Uint8Array([1, 2, 3]);
    const first = shard.apply("k", { expect: null, value: large, version: "1", deadline: 0 }, Date.now());
    const second = shard.apply("k", { expect: "1", value: small, version: "2", deadline: 0 }, Date.now());
    assert.deepEqual(await Promise.all([first, second]), [true, true]);
    const reread = new Sealed({ storage }, {});
    const stored = await reread.load("k");
    assert.equal(stored.version, "2");
    assert.deepEqual([...stored.value], [1, 2, 3]);
  });

  test("a response of several chunks is sealed across them and replayed whole", async () => {
    const big = "x".repeat(300 * 1024) + SECRET;
    const w = worker({ respond: () => new Response(big, { status: 201 }) });
    rotate(w.namespace, [OLD]);
    assert.equal((await w.handler(post('"big"'))).status, 201);
    rotate(w.namespace, [OLD]);
    assert.equal(await (await w.handler(post('"big"'))).text(), big);
    assert.ok(!inClear(dump(w.namespace), SECRET));
  });

  test("DurableObjectLocalStore seals the records in its object's storage", async () => {
    const storage = new FakeStorage();
    const handlerOn = (keys) =>
      withIdempotency(async () => Response.json({ ship_to: SECRET }, { status: 201 }), {
        principal: "none",
        store: new DurableObjectLocalStore({ storage }, { seal: { keys } }),
      });
    assert.equal((await handlerOn([OLD])(post('"local"'))).status, 201);
    assert.equal((await handlerOn([NEW, OLD])(post('"local"'))).headers.get("idempotent-replayed"), "true");
    assert.equal((await (await handlerOn([NEW])(post('"local"'))).json()).type, "urn:idem:problem:record-sealed");
    const values = [...storage.map.values()].filter((v) => v?.value instanceof Uint8Array).map((v) => Buffer.from(v.value));
    assert.ok(values.length > 0 && !inClear(values, SECRET));
  });
});
