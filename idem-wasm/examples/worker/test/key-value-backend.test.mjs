// The worker with every Durable Object class on the key-value storage backend (wrangler's
// `new_classes`), under workerd: such an object has `storage.kv` too, but its every call
// throws, so the stores read through the asynchronous API. Orders (DurableObjectLocalStore),
// timestamp keys (DurableObjectStore's shards) and webhook events (the inbox on the shards)
// run once and replay.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { count, post, startWorker } from "./runtime.mjs";

test("on the key-value backend every store answers: an order, a timestamp key and an event each run once and replay", { timeout: 60_000 }, async () => {
  const worker = await startWorker({ keyValue: true });
  try {
    const { url } = worker;
    const key = `"${randomUUID()}"`;
    const first = await post(url, { key });
    assert.equal(first.status, 201, await first.clone().text());
    const body = await first.text();
    const again = await post(url, { key });
    assert.equal(again.status, 201);
    assert.equal(again.headers.get("idempotent-replayed"), "true");
    assert.equal(await again.text(), body);

    const at = `app-1:${Date.now()}`;
    const payment = await post(url, { key: at, path: "/payments" });
    assert.equal(payment.status, 201, await payment.clone().text());
    const repaid = await post(url, { key: at, path: "/payments" });
    assert.equal(repaid.headers.get("idempotent-replayed"), "true");
    assert.equal(await count(url), 2);

    const event = JSON.stringify({ id: `evt_${randomUUID()}`, type: "payment.succeeded" });
    const deliver = () => post(url, { body: event, path: "/webhooks/payments" }).then((r) => r.json());
    assert.equal((await deliver()).outcome, "processed");
    assert.equal((await deliver()).outcome, "duplicate");
    assert.equal(await count(url), 3);
  } finally {
    await worker.dispose();
  }
});
