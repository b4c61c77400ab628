// What the handler's outcome does to the key, through the worker, under each
// IDEM_UNKNOWN_OUTCOME policy (IDEM-OUT-3, IDEM-OUT-4, IDEM-REPLAY-3): a deterministic 4xx is
// stored and replayed; a thrown handler or a 5xx is an unknown outcome, which by default
// lets the retry take over at once as recovered, with "store" is replayed, and with "hold"
// refuses retries.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { count, post, startWorker } from "./runtime.mjs";

const order = (outcome) => JSON.stringify({ amount: 4200, currency: "eur", outcome });
const fresh = () => `"${randomUUID()}"`;

async function withWorker(vars, body) {
  const worker = await startWorker({ vars });
  try {
    await body(worker.url);
  } finally {
    await worker.dispose();
  }
}

test('"reexecute" (the default): a thrown handler answers 500 problem+json, and the retry takes over as recovered', { timeout: 30_000 }, async () => {
  await withWorker({}, async (url) => {
    const key = fresh();
    const failed = await post(url, { key, body: order("error") });
    assert.equal(failed.status, 500);
    assert.equal(failed.headers.get("content-type"), "application/problem+json");
    assert.equal((await failed.json()).type, "about:blank");
    assert.equal(await count(url), 1);
    const retry = await post(url, { key, body: order("error") });
    assert.equal(retry.status, 201);
    assert.equal(retry.headers.get("idempotent-replayed"), null);
    assert.deepEqual(await retry.json(), { id: "ord_000002", execution: 2, recovered: true });
    const again = await post(url, { key, body: order("error") });
    assert.equal(again.headers.get("idempotent-replayed"), "true");
    assert.equal(await count(url), 2);

    // A decline is final: stored and replayed, one execution.
    const declineKey = fresh();
    const declined = await post(url, { key: declineKey, body: order("decline") });
    assert.equal(declined.status, 402);
    const declinedBody = await declined.text();
    const replay = await post(url, { key: declineKey, body: order("decline") });
    assert.equal(replay.status, 402);
    assert.equal(replay.headers.get("idempotent-replayed"), "true");
    assert.equal(await replay.text(), declinedBody);
    assert.equal(await count(url), 3);
  });
});

test('"store": a 5xx is stored and replayed; "hold": the key is refused until reconciled', { timeout: 30_000 }, async () => {
  await withWorker({ IDEM_UNKNOWN_OUTCOME: "store" }, async (url) => {
    const key = fresh();
    const first = await post(url, { key, body: order("unavailable") });
    assert.equal(first.status, 503);
    const body = await first.text();
    const retry = await post(url, { key, body: order("unavailable") });
    assert.equal(retry.status, 503);
    assert.equal(retry.headers.get("idempotent-replayed"), "true");
    assert.equal(await retry.text(), body);
    assert.equal(await count(url), 1);
  });
  await withWorker({ IDEM_UNKNOWN_OUTCOME: "hold" }, async (url) => {
    const key = fresh();
    const first = await post(url, { key, body: order("unavailable") });
    assert.equal(first.status, 503);
    await first.arrayBuffer();
    const retry = await post(url, { key, body: order("unavailable") });
    assert.equal(retry.status, 409);
    assert.equal(retry.headers.get("content-type"), "application/problem+json");
    assert.equal((await retry.json()).type, "urn:idem:problem:outcome-unknown");
    assert.equal(await count(url), 1);
  });
});
