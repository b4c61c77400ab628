// The inbox through the built package: the first delivery of a message is processed,
// redeliveries are acknowledged without processing, concurrent deliveries are not
// acknowledged until the first is done, another payload under the same id is a conflict,
// and a failed processing runs again on the next delivery. Through the memory store and
// through Durable Object shards.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { DurableObjectStore, IdempotencyShard, Inbox, MemoryStore } from "idem";
import { FakeNamespace, barrier } from "./helpers.mjs";

const EVENT = JSON.stringify({ id: "evt_1", type: "payment.succeeded", amount: 4200 });

for (const [name, makeStore] of [
  ["memory store", () => new MemoryStore()],
  ["Durable Object store", () => new DurableObjectStore(new FakeNamespace(IdempotencyShard))],
]) {
  describe(`inbox on the ${name}`, () => {
    test("a redelivery is acknowledged without processing; another payload is a conflict (IDEM-INBOX-1, IDEM-INBOX-3)", async () => {
      const inbox = new Inbox({ store: makeStore() });
      let processed = 0;
      const process = async () => void processed++;
      const first = await inbox.receive({ source: "psp", id: "evt_1", body: EVENT }, process);
      assert.deepEqual(first, { outcome: "processed", acknowledge: true });
      for (let i = 0; i < 3; i++) {
        assert.deepEqual(await inbox.receive({ source: "psp", id: "evt_1", body: EVENT }, process), { outcome: "duplicate", acknowledge: true });
      }
      const changed = await inbox.receive({ source: "psp", id: "evt_1", body: EVENT.replace("4200", "1") }, process);
      assert.deepEqual(changed, { outcome: "conflict", acknowledge: true });
      // The same id from another source is another message.
      assert.equal((await inbox.receive({ source: "other", id: "evt_1", body: EVENT }, process)).outcome, "processed");
      assert.equal(processed, 2);
    });

    test("one event delivered 5 times concurrently and 5 times later is processed once (IDEM-INBOX-1, IDEM-INBOX-2)", async () => {
      const inbox = new Inbox({ store: makeStore() });
      const gate = barrier();
      let processed = 0;
      const process = async () => {
        processed++;
        await gate.wait();
      };
      const concurrent = Array.from({ length: 5 }, () => inbox.receive({ source: "psp", id: "evt_2", body: EVENT }, process));
      await new Promise((resolve) => setTimeout(resolve, 20));
      gate.open();
      const outcomes = (await Promise.all(concurrent)).map((d) => d.outcome).sort();
      assert.deepEqual(outcomes, ["in-progress", "in-progress", "in-progress", "in-progress", "processed"]);
      for (let i = 0; i < 5; i++) {
        assert.equal((await inbox.receive({ source: "psp", id: "evt_2", body: EVENT }, process)).outcome, "duplicate");
      }
      assert.equal(processed, 1);
    });

    test("processing that throws is not acknowledged, and the next delivery runs it as recovered", async () => {
      const inbox = new Inbox({ store: makeStore() });
      const seen = [];
      await assert.rejects(
        inbox.receive({ source: "psp", id: "evt_3", body: EVENT }, async ({ recovered }) => {
          seen.push(recovered);
          throw new Error("the ledger was down");
        }),
        /ledger was down/,
      );
      const again = await inbox.receive({ source: "psp", id: "evt_3", body: EVENT }, async ({ recovered }) => void seen.push(recovered));
      assert.equal(again.outcome, "processed");
      assert.deepEqual(seen, [false, true]);
    });
  });
}

test("bad deliveries and options are refused (IDEM-JS-1)", async () => {
  const inbox = new Inbox({ store: new MemoryStore() });
  for (const bad of [{ id: "evt" }, { source: "", id: "evt" }, { source: "psp" }]) {
    await assert.rejects(inbox.receive(bad, () => {}), (e) => e instanceof RangeError && e.code === "IDEM-JS-1");
  }
  assert.throws(() => new Inbox({ store: new MemoryStore(), principal: "none" }), (e) => e.code === "IDEM-JS-1");
});
