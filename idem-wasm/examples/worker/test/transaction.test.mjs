// POST /orders runs inside the orders object, with its idempotency records beside the orders
// (DurableObjectLocalStore): the order is written with the stored response, in one atomic
// write, or never (IDEM-STORE-7). `GET /count` tells handler runs (`count`) from committed
// orders (`orders`).
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { ledger, post, startWorker } from "./runtime.mjs";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

test("an answer that is not stored commits no order; a stored one commits one, and its replays none", { timeout: 60_000 }, async () => {
  const worker = await startWorker();
  try {
    const { url } = worker;
    const key = `"${randomUUID()}"`;
    const unavailable = '{"amount":100,"currency":"eur","outcome":"unavailable"}';
    for (let i = 0; i < 2; i++) {
      const r = await post(url, { key, body: unavailable });
      assert.equal(r.status, 503);
      await r.arrayBuffer();
    }
    assert.deepEqual(await ledger(url), { count: 2, orders: 0 }, "two runs, no order: a 503 is not stored");
    const declined = await post(url, { key: `"${randomUUID()}"`, body: '{"amount":100,"currency":"eur","outcome":"decline"}' });
    assert.equal(declined.status, 402);
    await declined.arrayBuffer();
    assert.deepEqual(await ledger(url), { count: 3, orders: 1 }, "a stored 402 commits its (declined) order");
    const fresh = `"${randomUUID()}"`;
    const created = await post(url, { key: fresh });
    assert.equal(created.status, 201);
    const order = await created.json();
    for (let i = 0; i < 3; i++) {
      const replay = await post(url, { key: fresh });
      assert.equal(replay.headers.get("idempotent-replayed"), "true");
      assert.deepEqual(await replay.json(), order);
    }
    assert.deepEqual(await ledger(url), { count: 4, orders: 2 });
  } finally {
    await worker.dispose();
  }
});

test("an attempt that lost its lease to a retry commits no order: one order, from the attempt that completed", { timeout: 60_000 }, async () => {
  const worker = await startWorker({ vars: { IDEM_LEASE_MS: "1000", ORDER_DELAY_MS: "1600" } });
  try {
    const { url } = worker;
    const key = `"${randomUUID()}"`;
    const stalled = post(url, { key });
    await sleep(1200);
    const takeover = await post(url, { key });
    assert.equal(takeover.status, 201);
    const won = await takeover.json();
    assert.equal(won.recovered, true, "the retry took over the expired lease");
    const zombie = await stalled;
    await zombie.arrayBuffer();
    assert.deepEqual(await ledger(url), { count: 2, orders: 1 }, "two runs, one committed order");
    const replay = await post(url, { key });
    assert.deepEqual(await replay.json(), won, "the stored response is the winner's");
  } finally {
    await worker.dispose();
  }
});

test("orders of distinct keys that overlap in time are each committed once", { timeout: 60_000 }, async () => {
  const worker = await startWorker({ vars: { ORDER_DELAY_MS: "50" } });
  try {
    const { url } = worker;
    for (let round = 1; round <= 3; round++) {
      const answers = await Promise.all(Array.from({ length: 16 }, () => post(url, { key: `"${randomUUID()}"` })));
      for (const r of answers) {
        assert.equal(r.status, 201);
        await r.arrayBuffer();
      }
      assert.deepEqual(await ledger(url), { count: 16 * round, orders: 16 * round }, `round ${round}`);
    }
  } finally {
    await worker.dispose();
  }
});

test("the benchmark's unprotected routes: /unprotected/orders writes an order per request, key or not; /unprotected/runs writes none", { timeout: 60_000 }, async () => {
  const worker = await startWorker({ vars: { UNPROTECTED_ROUTE: "on" } });
  try {
    const { url } = worker;
    const key = `"${randomUUID()}"`;
    for (let i = 1; i <= 2; i++) {
      const r = await post(url, { key, path: "/unprotected/orders" });
      assert.equal(r.status, 201);
      assert.equal(r.headers.get("idempotent-replayed"), null);
      assert.equal((await r.json()).execution, i, "no idempotency: the same key runs again");
    }
    assert.deepEqual(await ledger(url), { count: 2, orders: 2 });
    const run = await post(url, { key, path: "/unprotected/runs" });
    assert.equal(run.status, 201);
    await run.arrayBuffer();
    assert.deepEqual(await ledger(url), { count: 3, orders: 2 }, "a run, no order");
  } finally {
    await worker.dispose();
  }
});
