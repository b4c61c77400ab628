// Duplicates that arrive while the first attempt runs, under both in-flight policies the
// worker's IDEM_IN_FLIGHT offers (IDEM-CONC-1): "reject" answers 409 with Retry-After, and
// "wait:MS" holds them until the first result is stored, then replays it. Either way the
// handler runs once. Each round sends its duplicates on separate connections at once.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { count, rawRequest, removeDir, startWorker, tempDir } from "./runtime.mjs";

const DUPLICATES = 16;
const ROUNDS = 3;
const ORDER = '{"amount":300,"currency":"eur"}';
// The handler takes this long, so that the duplicates overlap the first attempt.
const ORDER_DELAY_MS = "400";

/** `DUPLICATES` identical requests, each on a connection of its own, opened first and
 * released together. */
async function duplicates(url, key) {
  let open;
  const release = new Promise((resolve) => {
    open = resolve;
  });
  const head = ["authorization: Bearer a", "content-type: application/json", `idempotency-key: ${key}`];
  const pending = Array.from({ length: DUPLICATES }, () => rawRequest(url, { head, body: ORDER, release }));
  // Let the connections open, then send every request at once.
  await new Promise((resolve) => setTimeout(resolve, 100));
  open();
  const answers = await Promise.all(pending);
  return answers.map((a) => ({ status: a.status, replayed: a.headers["idempotent-replayed"] ?? null, retryAfter: a.headers["retry-after"], body: a.body }));
}

test('IDEM_IN_FLIGHT "reject": one execution, the other duplicates get 409 with Retry-After', { timeout: 60_000 }, async () => {
  const worker = await startWorker({ vars: { IDEM_IN_FLIGHT: "reject", ORDER_DELAY_MS } });
  try {
    for (let round = 0; round < ROUNDS; round++) {
      const before = await count(worker.url);
      const answers = await duplicates(worker.url, `"${randomUUID()}"`);
      assert.equal(await count(worker.url), before + 1, "one execution");
      const executed = answers.filter((a) => a.status === 201 && a.replayed === null);
      const conflicts = answers.filter((a) => a.status === 409);
      assert.equal(executed.length, 1, JSON.stringify(answers.map((a) => a.status)));
      assert.ok(conflicts.length > 0, "the duplicates overlapped the slow first attempt");
      for (const c of conflicts) {
        assert.equal(JSON.parse(c.body).type, "urn:idem:problem:in-progress");
        assert.ok(Number(c.retryAfter) >= 1, "409 carries Retry-After");
      }
      for (const a of answers) {
        if (a.status === 201) assert.equal(a.body, executed[0].body);
      }
    }
  } finally {
    await worker.dispose();
  }
});

test('IDEM_IN_FLIGHT "wait:5000": the duplicates wait for the first result and replay it', { timeout: 60_000 }, async () => {
  const dir = tempDir();
  const worker = await startWorker({ vars: { IDEM_IN_FLIGHT: "wait:5000", ORDER_DELAY_MS }, persist: dir });
  try {
    for (let round = 0; round < ROUNDS; round++) {
      const before = await count(worker.url);
      const answers = await duplicates(worker.url, `"${randomUUID()}"`);
      assert.equal(await count(worker.url), before + 1, "one execution");
      assert.deepEqual(
        answers.map((a) => a.status),
        Array(DUPLICATES).fill(201),
        "no duplicate is turned away while the first attempt runs",
      );
      const executed = answers.filter((a) => a.replayed === null);
      assert.equal(executed.length, 1);
      for (const a of answers) assert.equal(a.body, executed[0].body);
    }
  } finally {
    await worker.dispose();
    removeDir(dir);
  }
});
