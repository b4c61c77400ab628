// The module's memory grows in large steps as the in-module store fills up: V8 collects the
// JavaScript heap each time a WebAssembly memory grows, so growing a page at a time for
// every few hundred records made a growing store's requests pay for those collections.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Idempotency, MemoryStore, initSync } from "idem";

/** The in-module store as `Idempotency` drives it (every step inside the module), and the
 * same store behind a plain object, driven step by step through its `load` and `apply`. */
const stores = [
  ["driven inside the module", (store) => store],
  ["driven through load and apply", (store) => ({ load: (key) => store.load(key), apply: (key, write, now) => store.apply(key, write, now) })],
];

for (const [name, wrap] of stores) {
  test(`a growing MemoryStore grows the module's memory a few times, in large steps (${name})`, async () => {
    // The module is already instantiated: initSync hands back its exports.
    const { memory } = initSync();
    const idem = new Idempotency({ store: wrap(new MemoryStore({ maxEntries: 1_000_000, maxBytes: 2 ** 31 })), principal: "none" });
    const encoder = new TextEncoder();
    const start = memory.buffer.byteLength;
    const sizes = new Set([start]);
    for (let i = 0; i < 30_000; i++) {
      const body = { customer: { id: `cus_${i}` }, items: [{ sku: `sku_${i % 97}`, qty: 1 + (i % 3) }], note: "x".repeat(120) };
      const reply = await idem.handle(
        { method: "POST", target: "/orders", key: `"grow-${name}-${i}"`, contentType: "application/json", body: encoder.encode(JSON.stringify(body)) },
        () => ({ status: 201, headers: [["content-type", "application/json"]], body: `{"id":"ord_${i}","status":"created"}` }),
      );
      assert.equal(reply.status, 201);
      sizes.add(memory.buffer.byteLength);
    }
    const grown = memory.buffer.byteLength - start;
    // 30,000 records take several MiB: page by page (64 KiB) that would be a hundred growths
    // or more; in steps of an eighth of the memory (1 MiB at least) it is a handful.
    assert.ok(grown >= 4 * 2 ** 20, `the store grew the memory by only ${grown} bytes`);
    assert.ok(sizes.size - 1 <= 16, `the memory grew ${sizes.size - 1} times by ${grown} bytes in all`);
  });
}

test("an answer longer than the store keeps is never copied into the module: it is returned whole, and kept as response-not-stored (IDEM-STORE-5)", async () => {
  const { memory } = initSync();
  const idem = new Idempotency({ store: new MemoryStore(), principal: "none", maxResponseBytes: 1 << 20 });
  assert.equal(idem.maxResponseBytes, 1 << 20);
  const body = new Uint8Array(24 << 20).fill(7);
  const request = { method: "POST", target: "/exports", key: '"export-1"', body: new Uint8Array(0) };
  const start = memory.buffer.byteLength;
  const first = await idem.handle(request, () => ({ status: 200, body }));
  assert.equal(first.executed, true);
  assert.equal(first.body, body, "the caller's own bytes");
  assert.ok(memory.buffer.byteLength - start < body.byteLength, "the body did not go into the module");
  const retry = await idem.handle(request, () => assert.fail("runs again"));
  assert.equal(retry.status, 410);
  assert.equal(JSON.parse(new TextDecoder().decode(retry.body)).type, "urn:idem:problem:response-not-stored");

  // An answer the caller sends on itself, as it is produced: nothing of it is read.
  const streamed = { ...request, key: '"export-2"' };
  const passed = await idem.handle(streamed, () => ({ status: 201, headers: [["content-type", "text/csv"]], passThrough: true }));
  assert.deepEqual([passed.status, passed.executed, passed.passThrough, passed.body], [201, true, true, null]);
  assert.equal((await idem.handle(streamed, () => assert.fail("runs again"))).status, 410);
});
