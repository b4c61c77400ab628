// Expiry by Durable Object alarms (IDEM-TTL-4): every write sets the alarm of the object
// that holds the record (here the orders object, where POST /orders runs) from the record's
// next deadline, and the alarm expires records with no request touching them: the
// response is dropped at the response retention (the key answers 410 until the key retention,
// IDEM-TTL-3) and the record is deleted at the key retention (IDEM-TTL-2). Alarms are stored
// with the object, so they still fire after a restart of the runtime.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { INSPECTABLE as ENTRY, count, objectStorage as storage, post, removeDir, startWorker, tempDir } from "./runtime.mjs";

const RESPONSE_TTL_MS = 1500;
const KEY_TTL_MS = 3500;
const vars = {
  IDEM_RESPONSE_TTL_MS: String(RESPONSE_TTL_MS),
  IDEM_KEY_TTL_MS: String(KEY_TTL_MS),
  IDEM_LEASE_MS: String(RESPONSE_TTL_MS),
};

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `storage` until `done(state)` holds or `ms` pass; returns the last state. */
async function until(mf, done, ms) {
  const end = Date.now() + ms;
  for (;;) {
    const state = await storage(mf);
    if (done(state) || Date.now() >= end) return state;
    await sleep(100);
  }
}

test("alarms drop responses at the response retention and keys at the key retention, across a restart", { timeout: 60_000 }, async () => {
  const dir = tempDir();
  const persist = join(dir, "state");
  const keys = Array.from({ length: 6 }, () => `"${randomUUID()}"`);
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
      const stored = await storage(worker.mf);
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
      const tombstones = await storage(worker.mf);
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
      const empty = await until(worker.mf, (s) => s.records === 0 && s.deadlines === 0 && s.alarms.length === 0, 5000);
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
