// Records survive a restart of the runtime when Durable Object state is persisted: a key
// completed before the restart is replayed after it and the handler does not run again
// (IDEM-EXEC-1, IDEM-REPLAY-1); its fingerprint survives too (IDEM-FP-1); a key that was in
// flight when the runtime stopped stays claimed until its lease ends, then a retry takes over
// as recovered (IDEM-LEASE-1), when claims are written (ORDER_WRITES_ONLY = "off"; a claim
// held in memory ends with the object, test/writes-only.test.mjs).
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { count, post, removeDir, startWorker, tempDir } from "./runtime.mjs";

// Long enough that the restart (about a second) ends well inside it.
const LEASE_MS = 4000;
const vars = { IDEM_LEASE_MS: String(LEASE_MS) };

/** Runs `body(worker)` against a worker on `persist`, and always stops the runtime. */
async function withWorker(persist, body, more = {}) {
  const worker = await startWorker({ persist, vars: { ...vars, ...more } });
  try {
    return await body(worker);
  } finally {
    await worker.dispose();
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

test("a completed key is replayed after the runtime restarts, and nothing runs twice", { timeout: 60_000 }, async () => {
  const dir = tempDir();
  const persist = join(dir, "state");
  const key = `"${randomUUID()}"`;
  const body = '{"amount":1250,"currency":"eur","description":"restart"}';
  try {
    const first = await withWorker(persist, async ({ url }) => {
      const r = await post(url, { key, body });
      assert.equal(r.status, 201);
      assert.equal(r.headers.get("idempotent-replayed"), null);
      const text = await r.text();
      assert.equal(await count(url), 1);
      return { text, location: r.headers.get("location") };
    });
    assert.deepEqual(JSON.parse(first.text), { id: "ord_000001", execution: 1, recovered: false });

    await withWorker(persist, async ({ url }) => {
      assert.equal(await count(url), 1, "the ledger survived the restart");
      const replay = await post(url, { key, body });
      assert.equal(replay.status, 201);
      assert.equal(replay.headers.get("idempotent-replayed"), "true");
      assert.equal(replay.headers.get("location"), first.location);
      assert.equal(await replay.text(), first.text);
      assert.equal(await count(url), 1, "the replay did not execute");

      const changed = await post(url, { key, body: '{"amount":9999,"currency":"eur","description":"restart"}' });
      assert.equal(changed.status, 422);
      assert.equal(changed.headers.get("content-type"), "application/problem+json");
      assert.equal((await changed.json()).type, "urn:idem:problem:key-reuse-mismatch");

      // Another principal's key of the same name is a different record.
      const other = await post(url, { key, body, headers: { authorization: "Bearer b" } });
      assert.equal(other.status, 201);
      assert.equal(other.headers.get("idempotent-replayed"), null);
      assert.equal((await other.json()).execution, 2, "execution numbers continue after the restart");
      assert.equal(await count(url), 2);
    });

    // And once more: the state of both runs is there.
    await withWorker(persist, async ({ url }) => {
      const replay = await post(url, { key, body });
      assert.equal(replay.headers.get("idempotent-replayed"), "true");
      assert.equal(await replay.text(), first.text);
      assert.equal(await count(url), 2);
    });
  } finally {
    removeDir(dir);
  }
});

test("with claims written, a key in flight when the runtime stops stays claimed until its lease ends", { timeout: 60_000 }, async () => {
  const written = { ORDER_WRITES_ONLY: "off" };
  const dir = tempDir();
  const persist = join(dir, "state");
  const key = `"${randomUUID()}"`;
  const body = '{"amount":700,"currency":"eur","outcome":"crash"}';
  try {
    const crashedAt = await withWorker(persist, async ({ url }) => {
      // The first attempt dies without an answer of its own: workerd cancels it (500).
      const r = await post(url, { key, body });
      assert.equal(r.status, 500);
      await r.arrayBuffer();
      assert.equal(await count(url), 1);
      return Date.now();
    }, written);

    await withWorker(persist, async ({ url }) => {
      const blocked = await post(url, { key, body });
      const elapsed = Date.now() - crashedAt;
      assert.ok(elapsed < LEASE_MS, `the restart took ${elapsed} ms, longer than the lease`);
      assert.equal(blocked.status, 409, "the claim survived the restart");
      assert.equal((await blocked.json()).type, "urn:idem:problem:in-progress");
      assert.ok(Number(blocked.headers.get("retry-after")) >= 1);
      assert.equal(await count(url), 1, "nothing ran while the key was claimed");
      await sleep(Math.max(0, crashedAt + LEASE_MS + 100 - Date.now()));
      const taken = await post(url, { key, body });
      assert.equal(taken.status, 201);
      const order = await taken.json();
      assert.equal(order.recovered, true, "the retry after the lease is told it recovers");
      assert.equal(order.execution, 2);
      const replay = await post(url, { key, body });
      assert.equal(replay.headers.get("idempotent-replayed"), "true");
      assert.deepEqual(await replay.json(), order);
      assert.equal(await count(url), 2);
    }, written);
  } finally {
    removeDir(dir);
  }
});
