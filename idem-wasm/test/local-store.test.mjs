// DurableObjectLocalStore, the store of a handler inside the Durable Object that holds its
// data, against an in-memory fake of the Durable Object storage API: the object's one alarm
// shared with the records, claims held in memory with writesOnly, and the synchronous reads
// of a SQLite-backed object.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { DurableObjectLocalStore, Idempotency, idempotencyOf, withIdempotency } from "idem";
import { FakeStorage, barrier, manualClock, postOrder as post } from "./helpers.mjs";
/** A FakeStorage that refuses the first put writing a key that starts with `prefix`. */
function refusingOnce(prefix) {
  const storage = new FakeStorage();
  const put = storage.put.bind(storage);
  let refuse = true;
  storage.put = async (entries, value) => {
    if (refuse && typeof entries === "object" && Object.keys(entries).some((k) => k.startsWith(prefix))) {
      refuse = false;
      throw new Error("storage write failed");
    }
    return put(entries, value);
  };
  return storage;
}

/** A handler running inside one object over `storage`, on a `writesOnly` store: each run
 * extends its lease once, waits for `gate` (if given), then throws when `fail(n)` says so,
 * answers `status` when given, or writes `order:<n>` in its transaction and answers 201. */
function insideObject(storage, { gate, status, fail = () => false, idem = {} } = {}) {
  const store = new DurableObjectLocalStore({ storage }, { writesOnly: true });
  const state = { executions: 0, recovered: [] };
  const handler = withIdempotency(
    async (request) => {
      const n = ++state.executions;
      await request.json();
      const context = idempotencyOf(request);
      state.recovered.push(context.recovered);
      await context.extend();
      if (gate) await gate.wait();
      if (fail(n)) throw new Error("the handler failed");
      if (status !== undefined) return new Response("unavailable", { status });
      return store.transaction(context, async (tx) => {
        tx.put(`order:${n}`, { n });
        return new Response(`order ${n}`, { status: 201 });
      });
    },
    { principal: "none", store, ...idem },
  );
  return { handler, state, store };
}

describe("DurableObjectLocalStore shares the object's one alarm (IDEM-TTL-4)", () => {
  test("the object's own alarm and the records' deadlines never move each other: each fires, the object's once", async () => {
    const clock = manualClock(Date.now());
    const storage = new FakeStorage();
    const { handler, store } = insideObject(storage, { idem: { responseTtl: 1000, keyTtl: 3000, lease: 1000, now: clock } });
    const t0 = clock();
    // The object's own alarm, ten seconds out, set before any record exists.
    await store.setAlarm(t0 + 10_000);
    assert.equal(storage.alarm, t0 + 10_000);
    assert.equal((await handler(post('"own"'))).status, 201);
    assert.equal(storage.alarm, t0 + 1000, "the records' first deadline comes first");
    // The runtime fires the one alarm whenever it is due; the object calls the store.
    const fired = [];
    const realNow = Date.now;
    try {
      while (storage.alarm !== null) {
        const at = storage.alarm;
        Date.now = () => at;
        storage.alarm = null; // spent, as the runtime spends it
        fired.push([at - t0, await store.alarm()]);
      }
    } finally {
      Date.now = realNow;
    }
    // Response expiry, key expiry, then the object's own alarm: due once, then nothing left.
    assert.deepEqual(fired, [
      [1000, false],
      [3000, false],
      [10_000, true],
    ]);
    assert.equal(await store.getAlarm(), null);
    assert.deepEqual([...storage.map.keys()].filter((k) => k.startsWith("idem:r:")), [], "the record expired");
    // An own alarm set later than the records' next deadline stays behind it, and unset is gone.
    await store.setAlarm(clock() + 5000);
    await store.setAlarm(null);
    assert.equal(await store.getAlarm(), null);
    await assert.rejects(store.setAlarm("soon"), (e) => e.code === "IDEM-JS-1");
  });

  test("the object's alarm work that throws is run again by the platform's retry: the alarm is spent only once it has run", async () => {
    const storage = new FakeStorage();
    const { store } = insideObject(storage);
    const due = Date.now() - 1;
    await store.setAlarm(due);
    let runs = 0;
    const work = async () => {
      runs++;
      if (runs === 1) throw new Error("the object's work failed");
    };
    // The first run fails: the error reaches the runtime, which retries the alarm.
    await assert.rejects(store.alarm(work), /the object's work failed/);
    assert.equal(await store.getAlarm(), due, "still due");
    assert.equal(await store.alarm(work), true);
    assert.equal(runs, 2);
    assert.equal(await store.getAlarm(), null);
    // Spent: the next alarm does not run it.
    assert.equal(await store.alarm(work), false);
    assert.equal(runs, 2);
    assert.throws(() => store.alarm("work"), (e) => e.code === "IDEM-JS-1");
  });
});

/** FakeStorage that lists every write it is asked for: puts (by their keys), deletes and
 * alarms. */
function countingStorage() {
  const storage = new FakeStorage();
  const writes = [];
  const put = storage.put.bind(storage);
  const del = storage.delete.bind(storage);
  const setAlarm = storage.setAlarm.bind(storage);
  storage.put = (entries, value) => {
    writes.push(["put", Object.keys(typeof entries === "string" ? { [entries]: value } : entries).sort()]);
    return put(entries, value);
  };
  storage.delete = (keys) => {
    writes.push(["delete", keys]);
    return del(keys);
  };
  storage.setAlarm = (t) => {
    writes.push(["setAlarm", t]);
    return setAlarm(t);
  };
  return { storage, writes };
}

const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

test("a record written while the alarm runs the object's own work keeps an alarm for its deadline (IDEM-TTL-4)", async () => {
  const storage = new FakeStorage();
  const store = new DurableObjectLocalStore({ storage }, { writesOnly: false });
  const clock = manualClock(Date.now());
  const handler = withIdempotency(
    async (request) => {
      await request.json();
      return store.transaction(idempotencyOf(request), async (tx) => {
        tx.put("order", 1);
        return new Response("ok", { status: 201 });
      });
    },
    { principal: "none", store, responseTtl: 1000, keyTtl: 3000, lease: 1000, now: clock },
  );
  const t0 = clock();
  await store.setAlarm(t0 + 500);
  const gate = barrier();
  const realNow = Date.now;
  Date.now = () => t0 + 500;
  try {
    // The runtime spends the alarm it fires; the object's own work does I/O meanwhile.
    storage.alarm = null;
    const firing = store.alarm(() => gate.wait());
    await new Promise((resolve) => setTimeout(resolve, 20));
    // A request completes meanwhile: its record is due 1 s on.
    clock.advance(500);
    assert.equal((await handler(post('"during"'))).status, 201);
    gate.open();
    assert.equal(await firing, true);
  } finally {
    Date.now = realNow;
  }
  const due = [...storage.map.keys()].filter((k) => k.startsWith("idem:d:")).map((k) => Number(k.slice(7, 23)));
  assert.equal(due.length, 1);
  assert.ok(storage.alarm !== null && storage.alarm <= due[0], `the alarm (${storage.alarm === null ? null : storage.alarm - t0}) is not set for the record due at ${due[0] - t0}`);
});

describe("DurableObjectLocalStore with writesOnly (IDEM-STORE-8)", () => {
  test("writesOnly must be a boolean (IDEM-JS-1)", () => {
    assert.throws(
      () => new DurableObjectLocalStore({ storage: new FakeStorage() }, { writesOnly: "yes" }),
      (e) => e instanceof RangeError && e.code === "IDEM-JS-1" && /writesOnly/.test(e.message),
    );
  });

  test("a fresh key is written once, at its completion, with the handler's writes; its claim and heartbeat write nothing, yet a duplicate sees them", async () => {
    const { storage, writes } = countingStorage();
    const gate = barrier();
    const { handler, state } = insideObject(storage, { gate });
    const first = handler(post('"a"'));
    while (state.executions === 0) await pause(5);
    await pause(20);
    assert.deepEqual(writes, [], "nothing written while the order runs (claim and heartbeat held, no alarm)");
    const duplicate = await handler(post('"a"'));
    assert.equal(duplicate.status, 409);
    gate.open();
    assert.equal((await first).status, 201);
    assert.deepEqual(
      writes.map(([op, keys]) => [op, op === "put" ? keys.map((k) => (k.startsWith("idem:") ? k.slice(0, 7) : k)) : typeof keys]),
      [
        ["put", ["idem:d:", "idem:r:", "order:1"]],
        ["setAlarm", "number"],
      ],
      "one write: the record, its deadline and the order; then the alarm",
    );
    const replay = await handler(post('"a"'));
    assert.equal(replay.headers.get("idempotent-replayed"), "true");
    assert.equal(await replay.text(), "order 1");
    assert.equal(state.executions, 1);
  });

  test("a completion whose write with the handler's writes fails answers 503, never the handler's response (IDEM-STORE-7)", async () => {
    const storage = new FakeStorage();
    const put = storage.put.bind(storage);
    storage.put = async (entries, value) => {
      if (typeof entries === "object" && Object.keys(entries).some((k) => k.startsWith("order:"))) throw new Error("storage write failed");
      return put(entries, value);
    };
    const { handler } = insideObject(storage);
    const answer = await handler(post('"u"'));
    assert.equal(answer.status, 503);
    const problem = await answer.json();
    assert.equal(problem.type, "urn:idem:problem:store-unavailable");
    assert.equal(problem.requirement, "IDEM-STORE-7");
    assert.equal([...storage.map.keys()].some((k) => k.startsWith("order:")), false);
  });

  test("a completion whose write storage refuses is not replayed: the object reads the key from storage again (IDEM-STORE-7)", async () => {
    for (const writesOnly of [true, false]) {
      const storage = refusingOnce("order:");
      const store = new DurableObjectLocalStore({ storage }, { writesOnly });
      let runs = 0;
      const handler = withIdempotency(
        async (request) => {
          const n = ++runs;
          await request.json();
          return store.transaction(idempotencyOf(request), async (tx) => {
            tx.put(`order:${n}`, { n });
            return new Response(`order ${n}`, { status: 201 });
          });
        },
        { principal: "none", store },
      );
      assert.equal((await handler(post('"r"'))).status, 503, `writesOnly ${writesOnly}`);
      const retry = await handler(post('"r"'));
      assert.notEqual(retry.headers.get("idempotent-replayed"), "true", `writesOnly ${writesOnly}: a response whose writes never committed was replayed`);
      if (writesOnly) {
        // The claim was held in memory only: nothing of the attempt is left, and the retry runs.
        assert.equal(retry.status, 201);
        assert.equal(await retry.text(), "order 2");
        assert.deepEqual(
          [...storage.map.keys()].filter((k) => k.startsWith("order:")),
          ["order:2"],
        );
      } else {
        // The claim is in storage, in flight: its lease ends it (IDEM-OUT-5).
        assert.equal(retry.status, 409);
        assert.equal(runs, 1);
      }
    }
  });

  test("a claim whose write storage refuses runs nothing: 503, and the retry runs once (IDEM-STORE-4)", async () => {
    const storage = refusingOnce("idem:r:");
    const store = new DurableObjectLocalStore({ storage }, { writesOnly: false });
    let runs = 0;
    const handler = withIdempotency(
      async (request) => {
        runs++;
        await request.text();
        return new Response(`order ${runs}`, { status: 201 });
      },
      { principal: "none", store },
    );
    const refused = await handler(post('"claim"'));
    assert.equal(refused.status, 503);
    assert.equal(runs, 0, "the handler ran under a claim storage refused");
    const retry = await handler(post('"claim"'));
    assert.equal(retry.status, 201);
    assert.equal(runs, 1);
  });

  test("an alarm that cannot be set after a write storage took fails nothing: the request runs, and its retry replays (IDEM-STORE-9)", async () => {
    const storage = new FakeStorage();
    const setAlarm = storage.setAlarm.bind(storage);
    let fail = 1;
    storage.setAlarm = async (t) => {
      if (fail-- > 0) throw new Error("setAlarm failed");
      return setAlarm(t);
    };
    const store = new DurableObjectLocalStore({ storage }, { writesOnly: false });
    let runs = 0;
    const handler = withIdempotency(
      async (request) => {
        runs++;
        await request.text();
        return new Response("ok", { status: 201 });
      },
      { principal: "none", store },
    );
    assert.equal((await handler(post('"alarm"'))).status, 201);
    const retry = await handler(post('"alarm"'));
    assert.equal(retry.headers.get("idempotent-replayed"), "true");
    assert.equal(runs, 1);
    // The object's alarm is read again and set by the next write.
    assert.ok(storage.alarm !== null, "an alarm is set");
  });

  test("a released key (429: nothing happened) leaves nothing in storage, and its retry runs afresh", async () => {
    const { storage, writes } = countingStorage();
    const { handler, state } = insideObject(storage, { status: 429 });
    assert.equal((await handler(post('"b"'))).status, 429);
    assert.deepEqual(writes, []);
    assert.deepEqual([...storage.map.keys()], []);
    assert.equal((await handler(post('"b"'))).status, 429);
    assert.equal(state.executions, 2);
    assert.deepEqual(state.recovered, [false, false]);
  });

  test("an attempt that threw stays held for its retry, which takes over as recovered; only the retry's completion is written", async () => {
    const { storage, writes } = countingStorage();
    const { handler, state } = insideObject(storage, { fail: (n) => n === 1 });
    await assert.rejects(handler(post('"t"')), /the handler failed/);
    assert.deepEqual(writes, []);
    assert.equal((await handler(post('"t"'))).status, 201);
    assert.deepEqual(state.recovered, [false, true]);
    assert.deepEqual([...storage.map.keys()].filter((k) => k.startsWith("order:")), ["order:2"]);
  });

  test("a held claim is taken over after its lease as recovered, and the attempt that lost it commits nothing", async () => {
    const clock = manualClock(Date.now());
    const { storage } = countingStorage();
    const gate = barrier();
    const { handler, state } = insideObject(storage, { gate, idem: { lease: 1000, now: clock } });
    const stalled = handler(post('"l"'));
    while (state.executions === 0) await pause(5);
    clock.advance(1500);
    const takeover = handler(post('"l"'));
    while (state.executions === 1) await pause(5);
    gate.open();
    assert.equal((await takeover).status, 201);
    await stalled;
    assert.deepEqual(state.recovered, [false, true]);
    assert.deepEqual([...storage.map.keys()].filter((k) => k.startsWith("order:")), ["order:2"], "the winner's order only");
  });

  test("sessions and tokens on a writesOnly store are written, not held", async () => {
    const { storage } = countingStorage();
    const store = new DurableObjectLocalStore({ storage }, { writesOnly: true });
    const secret = "ab".repeat(32);
    const tokens = new Idempotency({ principal: "none", store, keyKind: "token", token: { secret, ttl: 60_000 } });
    const issued = await tokens.issueToken(post('"x"'), { route: "/orders" });
    const counters = new Idempotency({ principal: "none", store, keyKind: "counter", counter: { bits: 32, window: 8 } });
    await counters.openSession(post('"x"'), { route: "/orders", client: "c1", firstSeq: 0 });
    // A new object over the same storage (its memory lost) still finds both.
    const fresh = new DurableObjectLocalStore({ storage }, { writesOnly: true });
    const records = [...storage.map.keys()].filter((k) => k.startsWith("idem:r:"));
    assert.equal(records.length, 2, `a token and a session record in storage: ${records}`);
    for (const k of records) assert.notEqual(await fresh.load(k.slice(7)), null);
    assert.ok(issued.token);
  });

  test("past the object's cache of records, those read longest ago are read from storage again, and still replay", async () => {
    const { storage } = countingStorage();
    const { handler, state } = insideObject(storage);
    const n = 10_200;
    for (let i = 0; i < n; i++) assert.equal((await handler(post(`"k${i}"`))).status, 201);
    for (const i of [0, 1, n - 1]) {
      const replay = await handler(post(`"k${i}"`));
      assert.equal(replay.headers.get("idempotent-replayed"), "true", `k${i} replays`);
    }
    assert.equal(state.executions, n);
  });

  test("held claims applied without a time are all kept: none is taken for expired", async () => {
    const { storage, writes } = countingStorage();
    const store = new DurableObjectLocalStore({ storage }, { writesOnly: true });
    const claim = (v) => ({ expect: null, version: v, value: new Uint8Array([1, 2, 3]), deadline: Date.now() + 60_000, inFlight: true });
    for (const key of ["k1", "k2", "k3", "k4"]) assert.equal(await store.apply(key, claim(`v-${key}`)), true);
    assert.deepEqual(writes, [], "claims are held, not written");
    for (const key of ["k1", "k2", "k3", "k4"]) assert.equal((await store.load(key))?.version, `v-${key}`, `${key} still held`);
  });

  test("an object that restarts forgets its held claims: the key runs as a first attempt, and only the completed attempt's writes exist", async () => {
    const { storage } = countingStorage();
    const gate = barrier();
    const before = insideObject(storage, { gate });
    // The attempt never completes: its object is gone (a new store over the same storage).
    void before.handler(post('"c"'));
    while (before.state.executions === 0) await pause(5);
    const after = insideObject(storage);
    const retry = await after.handler(post('"c"'));
    assert.equal(retry.status, 201);
    assert.deepEqual(after.state.recovered, [false]);
    assert.deepEqual([...storage.map.keys()].filter((k) => k.startsWith("order:")), ["order:1"]);
  });
});

/** A FakeStorage with the synchronous key-value API of SQLite-backed objects (`storage.kv`),
 * whose asynchronous reads of records fail: records must be read through `kv`. */
function syncStorage() {
  const storage = new FakeStorage();
  const reads = [];
  storage.kv = {
    get(key) {
      reads.push(key);
      return structuredClone(storage.map.get(key));
    },
  };
  const get = storage.get.bind(storage);
  storage.get = (key) => {
    if ([key].flat().some((k) => k.startsWith("idem:r:"))) throw new Error("a record was read through the asynchronous API");
    return get(key);
  };
  return { storage, reads };
}

describe("DurableObjectLocalStore in a SQLite-backed object (storage.kv)", () => {
  test("a claim reads its record at once: duplicates racing on a cold object run once, and a new object over the same storage replays (IDEM-EXEC-1, IDEM-JS-3)", async () => {
    const { storage, reads } = syncStorage();
    for (let round = 0; round < 3; round++) {
      const gate = barrier();
      // A new store each round: a cold object, whose claims all read storage.
      const { handler, state } = insideObject(storage, { gate });
      const all = Array.from({ length: 16 }, () => handler(post(`"kv-${round}"`)));
      await pause(20);
      gate.open();
      const statuses = (await Promise.all(all)).map((r) => r.status);
      assert.equal(state.executions, 1);
      assert.equal(statuses.filter((s) => s === 201).length, 1);
      assert.equal(statuses.filter((s) => s === 409).length, 15);
      const replay = await insideObject(storage).handler(post(`"kv-${round}"`));
      assert.equal(replay.headers.get("idempotent-replayed"), "true");
      assert.equal(await replay.text(), "order 1");
    }
    assert.ok(reads.some((k) => k.startsWith("idem:r:")), "records were read through storage.kv");
  });

  test("a response over several storage values is read back whole (IDEM-STORE-5)", async () => {
    const { storage, reads } = syncStorage();
    const big = "x".repeat(300 * 1024) + "end";
    const over = () =>
      withIdempotency(async () => new Response(big, { status: 201 }), {
        principal: "none",
        store: new DurableObjectLocalStore({ storage }, { writesOnly: true }),
      });
    assert.equal((await over()(post('"big"'))).status, 201);
    const replay = await over()(post('"big"'));
    assert.equal(replay.headers.get("idempotent-replayed"), "true");
    assert.equal(await replay.text(), big);
    assert.ok(reads.some((k) => k.startsWith("idem:c:")), "its further chunks were read through storage.kv");
  });

  test("a record sealed elsewhere is refused by a store without a seal, and never run (IDEM-SEAL-3)", async () => {
    const written = new FakeStorage();
    const sealed = withIdempotency(async () => new Response("sealed", { status: 201 }), {
      principal: "none",
      store: new DurableObjectLocalStore({ storage: written }, { seal: { keys: [{ id: "k1", key: new Uint8Array(32).fill(1) }] } }),
    });
    assert.equal((await sealed(post('"s"'))).status, 201);
    const { storage } = syncStorage();
    for (const [k, v] of written.map) storage.map.set(k, v);
    const { handler, state } = insideObject(storage);
    const refused = await handler(post('"s"'));
    assert.equal(refused.status, 500);
    assert.equal((await refused.json()).type, "urn:idem:problem:record-sealed");
    assert.equal(state.executions, 0);
  });
});
