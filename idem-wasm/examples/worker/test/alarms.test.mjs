// Expiry by Durable Object alarms (IDEM-TTL-4): every write sets the shard's alarm from the
// record's next deadline, and the alarm expires records with no request touching them: the
// response is dropped at the response retention (the key answers 410 until the key retention,
// IDEM-TTL-3) and the record is deleted at the key retention (IDEM-TTL-2). Alarms are stored
// with the object, so they still fire after a restart of the runtime.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { count, post, removeDir, startWorker, tempDir } from "./runtime.mjs";
// The built package, as Node loads it (the worker itself runs its workerd entry).
const { Idempotency, shardName } = await import("../../../dist/node.js");

const RESPONSE_TTL_MS = 1500;
const KEY_TTL_MS = 3500;
const vars = {
  IDEM_RESPONSE_TTL_MS: String(RESPONSE_TTL_MS),
  IDEM_KEY_TTL_MS: String(KEY_TTL_MS),
  IDEM_LEASE_MS: String(RESPONSE_TTL_MS),
};
const ENTRY = "test/fixtures/inspectable.js";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The shard objects that own these keys for the worker's orders (principal `key:a`, the
 * API key the tests send), computed with the package's own engine: a store that only
 * records the storage key it is asked for. */
async function shardsOf(keys) {
  const names = new Set();
  const recording = {
    load: (key) => {
      names.add(shardName(key));
      throw new Error("recorded");
    },
    apply: () => false,
  };
  const idem = new Idempotency({ store: recording, principal: () => "key:a" });
  for (const key of keys) {
    await idem.handle({ method: "POST", target: "/orders", key, contentType: "application/json", body: new TextEncoder().encode("{}") }, () => {
      throw new Error("never runs");
    });
  }
  return [...names];
}

/** What the shards of the keys hold: `{ records, deadlines, alarms }`. */
async function storage(mf, shards) {
  const ns = await mf.getDurableObjectNamespace("IDEM");
  const out = { records: 0, deadlines: 0, alarms: [] };
  for (const name of shards) {
    const r = await ns.get(ns.idFromName(name)).fetch("http://shard/__storage");
    const { keys, alarm } = await r.json();
    out.records += keys.filter((k) => k.startsWith("r:")).length;
    out.deadlines += keys.filter((k) => k.startsWith("d:")).length;
    if (alarm !== null) out.alarms.push(alarm);
  }
  return out;
}

/** Polls `storage` until `done(state)` holds or `ms` pass; returns the last state. */
async function until(mf, shards, done, ms) {
  const end = Date.now() + ms;
  for (;;) {
    const state = await storage(mf, shards);
    if (done(state) || Date.now() >= end) return state;
    await sleep(100);
  }
}

test("alarms drop responses at the response retention and keys at the key retention, across a restart", { timeout: 60_000 }, async () => {
  const dir = tempDir();
  const persist = join(dir, "state");
  const keys = Array.from({ length: 6 }, () => `"${randomUUID()}"`);
  const shards = await shardsOf(keys);
  let completedAt;
  try {
    let worker = await startWorker({ persist, vars, entry: ENTRY });
    try {
      for (const key of keys) {
        const r = await post(worker.url, { key });
        assert.equal(r.status, 201);
        await r.arrayBuffer();
      }
      completedAt = Date.now();
      const stored = await storage(worker.mf, shards);
      assert.equal(stored.records, keys.length);
      assert.equal(stored.deadlines, keys.length, "each record is indexed by its deadline");
      assert.ok(stored.alarms.length > 0, "an alarm is set");
      for (const alarm of stored.alarms) {
        assert.ok(alarm > completedAt - 1000 && alarm <= completedAt + RESPONSE_TTL_MS, `alarm at the first deadline (${alarm - completedAt} ms)`);
      }
    } finally {
      await worker.dispose();
    }

    // The runtime restarts; the alarms were stored with the objects and fire in the new one.
    worker = await startWorker({ persist, vars, entry: ENTRY });
    try {
      // Past the response retention, no request has touched the keys: the alarms have turned
      // the records into tombstones (fewer bytes, a later deadline), and the key answers 410.
      await sleep(Math.max(0, completedAt + RESPONSE_TTL_MS + 400 - Date.now()));
      const tombstones = await storage(worker.mf, shards);
      assert.equal(tombstones.records, keys.length, "the keys are still remembered");
      assert.ok(tombstones.alarms.length > 0, "alarms are set for the key retention");
      for (const alarm of tombstones.alarms) {
        assert.ok(alarm > completedAt + RESPONSE_TTL_MS, "the next alarm is at the key retention");
      }
      const before = await count(worker.url);
      const late = await post(worker.url, { key: keys[0] });
      assert.equal(late.status, 410);
      assert.equal((await late.json()).type, "urn:idem:problem:key-expired");
      assert.equal(await count(worker.url), before, "an expired response never runs the handler again");

      // Past the key retention, the alarms have deleted every record and index entry, and
      // no alarm is left.
      await sleep(Math.max(0, completedAt + KEY_TTL_MS + 200 - Date.now()));
      const empty = await until(worker.mf, shards, (s) => s.records === 0 && s.deadlines === 0 && s.alarms.length === 0, 5000);
      assert.deepEqual(empty, { records: 0, deadlines: 0, alarms: [] });
      const again = await post(worker.url, { key: keys[1] });
      assert.equal(again.status, 201, "after the key retention the key is new");
      assert.equal(again.headers.get("idempotent-replayed"), null);
    } finally {
      await worker.dispose();
    }
  } finally {
    removeDir(dir);
  }
});
