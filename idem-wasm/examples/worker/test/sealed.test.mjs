// Sealed records under workerd (IDEM-SEAL-1..3), with Durable Object state persisted to
// disk: with IDEM_SEAL_KEYS set, neither the orders object's records (DurableObjectLocalStore)
// nor the shards' (IdempotencyShard, for POST /payments) hold a request or response byte in
// clear in the files workerd writes, the records replay after a restart, keys rotate, and a
// record under a key the worker no longer holds is refused with 500 record-sealed, never run.
import assert from "node:assert/strict";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { count, post, removeDir, startWorker, tempDir } from "./runtime.mjs";

const b64 = (byte) => Buffer.alloc(32, byte).toString("base64");
const K1 = `2026-05:${b64(1)}`;
const K2 = `2026-11:${b64(2)}`;
const SECRET = "Ada Lovelace, 12 St James's Square";
/** What only a stored response holds: its body's fields and its Location header. The
 * handler's own order rows are its data, not idempotency records, and stay as it writes them. */
const RESPONSE_TEXT = ['"execution":', "/orders/ord_"];

/** Every file under `dir`, as bytes. */
function files(dir) {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? files(path) : [readFileSync(path)];
  });
}

async function withWorker(persist, seal, body) {
  const worker = await startWorker({ persist, vars: seal === undefined ? {} : { IDEM_SEAL_KEYS: seal } });
  try {
    return await body(worker);
  } finally {
    await worker.dispose();
  }
}

const order = (url, key) => post(url, { key: `"${key}"`, body: JSON.stringify({ amount: 4200, currency: "eur", description: SECRET }) });
const payment = (url, key) => post(url, { key, path: "/payments", body: JSON.stringify({ amount: 1200, currency: "eur", description: SECRET }) });

test("records sealed in Durable Object storage on disk, replayed across restarts and rotation, refused without their key", { timeout: 120_000 }, async () => {
  const dir = tempDir();
  const persist = join(dir, "state");
  const stamp = `c1:${Date.now()}`;
  try {
    const [o, p] = await withWorker(persist, K1, async ({ url }) => {
      const o = await order(url, "sealed-order");
      const p = await payment(url, stamp);
      assert.deepEqual([o.status, p.status], [201, 201]);
      return [await o.text(), await p.text()];
    });
    // The dump: the state files hold neither the requests' nor the responses' text.
    const dump = files(persist);
    assert.ok(dump.length > 0);
    for (const text of [SECRET, ...RESPONSE_TEXT]) assert.ok(!dump.some((b) => b.includes(text)), `${text} is stored in clear`);

    // Rotated: both replay, nothing runs again.
    await withWorker(persist, `${K2},${K1}`, async ({ url }) => {
      const ro = await order(url, "sealed-order");
      const rp = await payment(url, stamp);
      assert.deepEqual([ro.headers.get("idempotent-replayed"), await ro.text()], ["true", o]);
      assert.deepEqual([rp.headers.get("idempotent-replayed"), await rp.text()], ["true", p]);
      assert.equal(await count(url), 2);
    });

    // The old key dropped: refused, never run.
    await withWorker(persist, K2, async ({ url }) => {
      for (const r of [await order(url, "sealed-order"), await payment(url, stamp)]) {
        assert.equal(r.status, 500);
        assert.equal(r.headers.get("content-type"), "application/problem+json");
        assert.equal((await r.json()).type, "urn:idem:problem:record-sealed");
      }
      assert.equal(await count(url), 2);
    });
  } finally {
    removeDir(dir);
  }
});

test("the dump check can fail: without seal keys the same state files hold the response", { timeout: 60_000 }, async () => {
  const dir = tempDir();
  const persist = join(dir, "state");
  try {
    await withWorker(persist, undefined, async ({ url }) => {
      assert.equal((await order(url, "clear-order")).status, 201);
    });
    for (const text of RESPONSE_TEXT) assert.ok(files(persist).some((b) => b.includes(text)), text);
  } finally {
    removeDir(dir);
  }
});
