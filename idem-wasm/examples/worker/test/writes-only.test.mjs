// POST /orders with its claims held in the orders object's memory (ORDER_WRITES_ONLY = "on",
// DurableObjectLocalStore's `writesOnly`, IDEM-STORE-8): while an order runs, storage holds
// no record of its key, yet a duplicate is refused; the completion writes the record with
// the order; and an order whose object dies leaves nothing behind, so its key is free at
// once. With "off", the claim is in storage while the order runs.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { INSPECTABLE, ledger, objectStorage, post, startWorker } from "./runtime.mjs";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Waits until the orders object has counted `runs` handler runs. */
async function untilRuns(url, runs) {
  const end = Date.now() + 10_000;
  while ((await ledger(url)).count < runs) {
    if (Date.now() >= end) throw new Error(`the handler did not run ${runs} time(s) within 10 s`);
    await sleep(20);
  }
}

for (const [writesOnly, heldInMemory] of [
  ["on", true],
  ["off", false],
]) {
  test(`ORDER_WRITES_ONLY "${writesOnly}": while an order runs, its claim is ${heldInMemory ? "only in the object's memory" : "in storage"}, and a duplicate is refused`, { timeout: 60_000 }, async () => {
    const worker = await startWorker({ entry: INSPECTABLE, vars: { ORDER_WRITES_ONLY: writesOnly, ORDER_DELAY_MS: "1500" } });
    try {
      const { url, mf } = worker;
      const key = `"${randomUUID()}"`;
      const first = post(url, { key });
      // The run is counted before the handler's delay: from here the order is in flight.
      await untilRuns(url, 1);
      const during = await objectStorage(mf);
      assert.equal(during.records, heldInMemory ? 0 : 1, "idempotency records in storage while the order runs");
      assert.equal(during.alarms.length, heldInMemory ? 0 : 1, "an alarm only for a written claim");
      const duplicate = await post(url, { key });
      assert.equal(duplicate.status, 409, "the claim is seen by the duplicate");
      assert.equal((await duplicate.json()).type, "urn:idem:problem:in-progress");
      const created = await first;
      assert.equal(created.status, 201);
      const order = await created.json();
      assert.equal(order.recovered, false);
      const after = await objectStorage(mf);
      assert.equal(after.records, 1, "the completion wrote the record");
      assert.deepEqual(await ledger(url), { count: 1, orders: 1 });
      const replay = await post(url, { key });
      assert.equal(replay.headers.get("idempotent-replayed"), "true");
      assert.deepEqual(await replay.json(), order);
    } finally {
      await worker.dispose();
    }
  });
}

test('ORDER_WRITES_ONLY "on": an order whose object dies leaves nothing, and its key runs afresh at once', { timeout: 60_000 }, async () => {
  const worker = await startWorker({ entry: INSPECTABLE, vars: { IDEM_LEASE_MS: "60000" } });
  try {
    const { url, mf } = worker;
    const key = `"${randomUUID()}"`;
    // The first attempt counts its run, then the object aborts before its transaction ends.
    const crashed = await post(url, { key, body: '{"amount":700,"currency":"eur","outcome":"crash"}' });
    assert.equal(crashed.status, 500);
    await crashed.arrayBuffer();
    assert.deepEqual(await ledger(url), { count: 1, orders: 0 }, "one run, no order committed");
    assert.equal((await objectStorage(mf)).records, 0, "no record of the key survived the object");
    // Within the 60-second lease, with another body: there is no claim to wait for and no
    // fingerprint to compare, because nothing of the attempt exists.
    const retry = await post(url, { key });
    assert.equal(retry.status, 201);
    const order = await retry.json();
    assert.equal(order.recovered, false, "a first attempt: nothing tells it an earlier one ran");
    assert.deepEqual(await ledger(url), { count: 2, orders: 1 }, "two runs, one committed order");
    const replay = await post(url, { key });
    assert.equal(replay.headers.get("idempotent-replayed"), "true");
    assert.deepEqual(await replay.json(), order);
  } finally {
    await worker.dispose();
  }
});
