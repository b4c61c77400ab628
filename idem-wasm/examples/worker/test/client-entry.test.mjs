// The client's workerd entry (`idem/client` under the `workerd` condition,
// dist/client-workerd.js) in workerd: the worker sends an order to its own POST /orders with
// idempotentFetch, then sends it again under the same key, and the order is created once.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";
import { count, startWorker } from "./runtime.mjs";

test("idempotentFetch from the client's workerd entry sends once and is replayed under its key", { timeout: 30_000 }, async () => {
  const worker = await startWorker({ entry: "test/fixtures/sender.js" });
  try {
    const send = async (key) => {
      const response = await fetch(`${worker.url}/__send`, {
        method: "POST",
        body: JSON.stringify({ key }),
        signal: AbortSignal.timeout(10_000),
      });
      assert.equal(response.status, 200, await response.clone().text());
      return response.json();
    };
    const key = randomUUID();
    const first = await send(key);
    assert.deepEqual(
      { outcome: first.outcome, status: first.status, attempts: first.attempts, key: first.key, replayed: first.replayed },
      { outcome: "completed", status: 201, attempts: 1, key, replayed: null },
    );
    const again = await send(key);
    assert.equal(again.outcome, "completed");
    assert.equal(again.replayed, "true", "the second send under the same key is the stored answer");
    assert.deepEqual(again.order, first.order);
    assert.equal(await count(worker.url), 1, "the order ran once");
  } finally {
    await worker.dispose();
  }
});
