// Status queries through the worker (IDEM-STATUS-1 to IDEM-STATUS-4): a GET with
// Idempotency-Status on /orders is answered by the orders object from its own storage, in the
// caller's account only; a settled key refuses its late original, which never runs; the
// session and token routes take no status queries.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { count, post, startWorker } from "./runtime.mjs";

const fresh = () => `"${randomUUID()}"`;

function ask(url, key, field, { account = "a", path = "/orders" } = {}) {
  return fetch(`${url}${path}`, {
    headers: { authorization: `Bearer ${account}`, "idempotency-key": key, "idempotency-status": field },
    signal: AbortSignal.timeout(10_000),
  });
}

async function document(response) {
  const text = await response.text();
  assert.equal(response.status, 200, text);
  assert.equal(response.headers.get("content-type"), "application/vnd.idem.key-status+json");
  assert.equal(response.headers.get("cache-control"), "no-store");
  return JSON.parse(text);
}

test("a status query on /orders tells what became of a key, in the caller's account, and a settle stops the late original", { timeout: 60_000 }, async () => {
  const worker = await startWorker();
  try {
    const url = worker.url;
    const key = fresh();
    assert.equal((await document(await ask(url, key, "POST"))).status, "unknown");
    assert.equal((await post(url, { key })).status, 201);
    const done = await document(await ask(url, key, "POST"));
    assert.deepEqual(done, { key: key.slice(1, -1), response: { replayable: true, status: 201 }, status: "completed" });
    // Another account's key is unknown to the caller.
    assert.equal((await document(await ask(url, key, "POST", { account: "b" }))).status, "unknown");
    assert.equal(await count(url), 1);

    const lost = fresh();
    assert.equal((await document(await ask(url, lost, "POST; settle"))).status, "not-executed");
    const late = await post(url, { key: lost });
    assert.equal(late.status, 409);
    assert.equal((await late.json()).type, "urn:idem:problem:key-settled");
    assert.equal(await count(url), 1, "the late original never ran");

    // Bad queries are problems; the operations' own routes take none.
    const bad = await ask(url, key, "POST; later");
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).type, "about:blank");
    const tokens = await ask(url, key, "POST", { path: "/sessions" });
    assert.equal(tokens.status, 405);
    // A GET without the field is not a route.
    const plain = await fetch(`${url}/orders`, { headers: { authorization: "Bearer a" } });
    assert.equal(plain.status, 405);
  } finally {
    await worker.dispose();
  }
});
