// The inbox through the built package: the first delivery of a message is processed,
// redeliveries are acknowledged without processing, concurrent deliveries are not
// acknowledged until the first is done, another payload under the same id is a conflict,
// and a failed processing runs again on the next delivery. Through the memory store and
// through Durable Object shards.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { DurableObjectStore, IdempotencyShard, Inbox, MemoryStore } from "idem";
import { FakeNamespace, barrier, manualClock } from "./helpers.mjs";

/** A delivery's outcome with its receipt's status and JSON body. */
async function receipt({ outcome, acknowledge, response }) {
  return { outcome, acknowledge, status: response.status, body: await response.json() };
}

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
      assert.deepEqual(await receipt(first), { outcome: "processed", acknowledge: true, status: 200, body: { outcome: "processed", received: true } });
      for (let i = 0; i < 3; i++) {
        const again = await inbox.receive({ source: "psp", id: "evt_1", body: EVENT }, process);
        assert.deepEqual(await receipt(again), { outcome: "duplicate", acknowledge: true, status: 200, body: { outcome: "duplicate", received: true } });
      }
      const changed = await inbox.receive({ source: "psp", id: "evt_1", body: EVENT.replace("4200", "1") }, process);
      assert.deepEqual(await receipt(changed), { outcome: "conflict", acknowledge: true, status: 200, body: { outcome: "conflict", received: true } });
      // The same id from another source is another message.
      assert.equal((await inbox.receive({ source: "other", id: "evt_1", body: EVENT }, process)).outcome, "processed");
      assert.equal(processed, 2);
    });

    test("a processing longer than the lease keeps it with extend(): a redelivery meanwhile is in progress, not processed again (IDEM-INBOX-2, IDEM-LEASE-1)", async () => {
      const clock = manualClock(Date.now());
      const inbox = new Inbox({ store: makeStore(), now: clock, lease: 1000 });
      let runs = 0;
      const halfway = barrier();
      const done = barrier();
      let seen;
      const first = inbox.receive({ source: "psp", id: "evt_long", body: EVENT }, async (context) => {
        runs++;
        seen = context;
        clock.advance(800);
        const before = context.leaseExpires;
        await context.extend();
        assert.ok(context.leaseExpires > before, "the lease moved");
        halfway.open();
        await done.wait();
      });
      await halfway.wait();
      clock.advance(800);
      const again = await inbox.receive({ source: "psp", id: "evt_long", body: EVENT }, async () => void runs++);
      assert.equal(again.outcome, "in-progress");
      assert.equal(again.acknowledge, false);
      done.open();
      assert.equal((await first).outcome, "processed");
      assert.equal(runs, 1);
      assert.deepEqual(Object.keys(seen).sort(), ["extend", "fence", "id", "leaseExpires", "recovered", "source"]);
    });

    test("another payload under the id of a message whose processing failed is refused unacknowledged; the message is processed on its next delivery (IDEM-INBOX-3)", async () => {
      const inbox = new Inbox({ store: makeStore() });
      const first = '{"id":"evt_f","attempt":1}';
      await assert.rejects(
        inbox.receive({ source: "psp", id: "evt_f", body: first, contentType: "application/json" }, async () => {
          throw new Error("ledger down");
        }),
        /ledger down/,
      );
      let processed = 0;
      const changed = await inbox.receive({ source: "psp", id: "evt_f", body: '{"id":"evt_f","attempt":2}', contentType: "application/json" }, async () => void processed++);
      assert.equal(changed.outcome, "refused");
      assert.equal(changed.acknowledge, false);
      assert.equal(changed.response.status, 422);
      assert.equal(processed, 0);
      const again = await inbox.receive({ source: "psp", id: "evt_f", body: first, contentType: "application/json" }, async ({ recovered }) => {
        assert.equal(recovered, true);
        processed++;
      });
      assert.equal(again.outcome, "processed");
      assert.equal(processed, 1);
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
      const results = await Promise.all(concurrent);
      const outcomes = results.map((d) => d.outcome).sort();
      assert.deepEqual(outcomes, ["in-progress", "in-progress", "in-progress", "in-progress", "processed"]);
      // A busy one is not acknowledged: the receipt asks the sender to deliver it again.
      for (const busy of results.filter((d) => d.outcome === "in-progress")) {
        assert.equal(busy.acknowledge, false);
        assert.equal(busy.response.status, 409);
        assert.equal(busy.response.headers.get("retry-after"), String(busy.retryAfter));
        assert.equal((await busy.response.json()).type, "urn:idem:problem:in-progress");
      }
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

test("a redelivery after the response retention and inside the key retention is a duplicate: processed once, both redeliveries acknowledged (IDEM-INBOX-1)", async () => {
  // A sender redelivers for days; the default retention keeps a response 24 h and a key
  // 7 days. Redeliveries at 2 h and at 27 h.
  const clock = manualClock();
  const store = new MemoryStore();
  const inbox = new Inbox({ store, now: clock });
  let processed = 0;
  const process = async () => void processed++;
  const event = JSON.stringify({ id: "evt_7", type: "payment.succeeded", amount: 4200 });
  const first = await inbox.receive({ source: "payments", id: "evt_7", body: event, contentType: "application/json" }, process);
  assert.equal(first.outcome, "processed");
  const redeliveries = [];
  for (const hours of [2, 27]) {
    clock.set(clock() + (hours === 2 ? 2 : 25) * 3600e3);
    store.sweep(clock());
    const again = await inbox.receive({ source: "payments", id: "evt_7", body: event, contentType: "application/json" }, process);
    assert.deepEqual([again.outcome, again.acknowledge], ["duplicate", true], `at ${hours} h`);
    redeliveries.push(again);
  }
  assert.equal(processed, 1);
  for (const again of redeliveries) {
    assert.deepEqual(await receipt(again), { outcome: "duplicate", acknowledge: true, status: 200, body: { outcome: "duplicate", received: true } });
  }
  // The message's record is where every host keeps it: `<source>#inbox` and the raw id.
  assert.notEqual(store.load("14:payments#inboxevt_7"), null);
});

test("a delivery with an id that is not one is refused with the key's problem (IDEM-INBOX-1)", async () => {
  const inbox = new Inbox({ store: new MemoryStore() });
  let processed = 0;
  const refused = await inbox.receive({ source: "psp", id: "evt\n1", body: EVENT }, async () => void processed++);
  assert.equal(refused.outcome, "refused");
  assert.equal(refused.acknowledge, false);
  assert.equal(refused.response.status, 400);
  assert.equal((await refused.response.json()).type, "urn:idem:problem:malformed-key");
  assert.equal(processed, 0);
});

test("bad deliveries and options are refused (IDEM-JS-1)", async () => {
  const inbox = new Inbox({ store: new MemoryStore() });
  for (const bad of [{ id: "evt" }, { source: "", id: "evt" }, { source: "psp" }]) {
    await assert.rejects(inbox.receive(bad, () => {}), (e) => e instanceof RangeError && e.code === "IDEM-JS-1");
  }
  // Sources with a lone surrogate (as JSON.parse makes of "\ud800"): in the module each
  // would be U+FFFD, and the second sender's message taken for the first's duplicate.
  let processed = 0;
  assert.equal((await inbox.receive({ source: "psp\ufffd", id: "evt", body: "{}" }, () => void processed++)).acknowledge, true);
  for (const source of ["psp\ud800", "psp\udc00"]) {
    await assert.rejects(inbox.receive({ source, id: "evt", body: "{}" }, () => void processed++), (e) => e instanceof RangeError && e.code === "IDEM-JS-1");
  }
  assert.equal(processed, 1);
  assert.throws(() => new Inbox({ store: new MemoryStore(), principal: "none" }), (e) => e.code === "IDEM-JS-1");
});

test("a payload given as an ArrayBuffer or a view of one is that payload; a body of another type and a missing process are refused before any claim (IDEM-INBOX-3, IDEM-JS-1)", async () => {
  const inbox = new Inbox({ store: new MemoryStore() });
  let processed = 0;
  const process = async () => void processed++;
  const bytes = new TextEncoder().encode(EVENT);
  const first = await inbox.receive({ source: "psp", id: "evt_b", body: bytes.buffer.slice(0) }, process);
  assert.equal(first.outcome, "processed");
  // The same payload as text, and as a view of a larger buffer, is a duplicate.
  assert.equal((await inbox.receive({ source: "psp", id: "evt_b", body: EVENT }, process)).outcome, "duplicate");
  const framed = new Uint8Array(bytes.length + 4);
  framed.set(bytes, 2);
  assert.equal((await inbox.receive({ source: "psp", id: "evt_b", body: new DataView(framed.buffer, 2, bytes.length) }, process)).outcome, "duplicate");
  // Another payload as an ArrayBuffer is a conflict, not taken for an empty one.
  const other = new TextEncoder().encode(EVENT.replace("4200", "1")).buffer;
  assert.equal((await inbox.receive({ source: "psp", id: "evt_b", body: other }, process)).outcome, "conflict");
  assert.equal(processed, 1);

  for (const body of [42, { id: "evt_c" }, [1, 2]]) {
    await assert.rejects(inbox.receive({ source: "psp", id: "evt_c", body }, process), (e) => e instanceof RangeError && e.code === "IDEM-JS-1");
  }
  await assert.rejects(inbox.receive({ source: "psp", id: "evt_c", body: EVENT }), (e) => e instanceof RangeError && e.code === "IDEM-JS-1");
  // Nothing was claimed: the first real delivery is processed, not recovered.
  let context;
  const later = await inbox.receive({ source: "psp", id: "evt_c", body: EVENT }, async (c) => {
    context = c;
  });
  assert.equal(later.outcome, "processed");
  assert.equal(context.recovered, false);
});
