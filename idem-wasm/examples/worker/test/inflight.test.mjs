// Duplicates that arrive while the first attempt runs, under both in-flight policies the
// worker's IDEM_IN_FLIGHT offers (IDEM-CONC-1, IDEM-CONC-2): "reject" answers 409 with
// Retry-After; "wait:MS" holds the latest duplicate until the first result is stored, then
// replays it (earlier waiters, superseded, get 409). Either way the handler runs once. Each
// round sends its duplicates on separate connections at once. The worker uses one
// withIdempotency wrapper for every request: a waiting request awaits only its own timers
// and store calls, which workerd allows.
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { count, rawRequest, removeDir, startWorker, tempDir } from "./runtime.mjs";

const DUPLICATES = 32;
const ROUNDS = 5;
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

test('IDEM_IN_FLIGHT "wait:5000": one shared wrapper; the latest waiter gets the first result, no duplicate runs (IDEM-CONC-2)', { timeout: 90_000 }, async () => {
  const dir = tempDir();
  const worker = await startWorker({ vars: { IDEM_IN_FLIGHT: "wait:5000", ORDER_DELAY_MS }, persist: dir });
  try {
    for (let round = 0; round < ROUNDS; round++) {
      const before = await count(worker.url);
      const answers = await duplicates(worker.url, `"${randomUUID()}"`);
      assert.equal(await count(worker.url), before + 1, "one execution");
      const statuses = answers.map((a) => a.status);
      assert.ok(statuses.every((s) => s === 201 || s === 409), JSON.stringify(statuses));
      const executed = answers.filter((a) => a.status === 201 && a.replayed === null);
      const replayed = answers.filter((a) => a.replayed === "true");
      assert.equal(executed.length, 1);
      // Duplicates that arrive together supersede each other's waits: only the latest keeps
      // waiting, and it gets the first attempt's response.
      assert.ok(replayed.length >= 1, "the latest waiter waited for the result");
      for (const a of [...executed, ...replayed]) assert.equal(a.body, executed[0].body);
      for (const a of answers.filter((x) => x.status === 409)) {
        assert.equal(JSON.parse(a.body).type, "urn:idem:problem:in-progress");
        assert.ok(Number(a.retryAfter) >= 1);
      }
    }
    // A duplicate on its own waits for the first result and replays it.
    const key = `"${randomUUID()}"`;
    const head = ["authorization: Bearer a", "content-type: application/json", `idempotency-key: ${key}`];
    const first = rawRequest(worker.url, { head, body: ORDER });
    await new Promise((resolve) => setTimeout(resolve, 100));
    const second = await rawRequest(worker.url, { head, body: ORDER });
    assert.equal((await first).status, 201);
    assert.equal(second.status, 201);
    assert.equal(second.headers["idempotent-replayed"], "true");
  } finally {
    await worker.dispose();
    removeDir(dir);
  }
});
