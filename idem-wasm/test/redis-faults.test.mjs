// RedisStore when its connection dies with a write's answer on the way, on a private Redis:
// Redis made the write, the connection is killed before the answer goes out, and ioredis
// sends the script again once it has reconnected. A claim is its writer's own, and runs its
// handler at once; a completion is its own, and its caller gets its own answer, not a
// replay. Writes alike to the byte from different attempts (takeovers of one lease in the
// same millisecond) are still made once.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { withIdempotency } from "idem";
import { manualClock } from "./helpers.mjs";
import { RedisStore } from "idem/redis";
import Redis from "ioredis";
import { startRedis } from "./servers.mjs";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

const post = (key) => new Request("http://orders.test/orders", { method: "POST", headers: { "idempotency-key": `"${key}"` }, body: "{}" });

/** Keeps Redis busy for `ms` (a script that waits: Redis runs nothing else meanwhile). */
const BUSY = "local t = redis.call('TIME') local s = t[1] * 1e6 + t[2] repeat local n = redis.call('TIME') until n[1] * 1e6 + n[2] - s > tonumber(ARGV[1]) * 1000 return 1";

describe("RedisStore: a write whose answer is lost with its connection", () => {
  let server;
  const clients = [];
  const client = () => {
    const redis = new Redis(server.url);
    redis.on("error", () => {});
    clients.push(redis);
    return redis;
  };
  before(async () => {
    server = await startRedis();
  });
  after(async () => {
    for (const redis of clients) redis.disconnect();
    await server?.stop();
  });

  test("Redis made the claim, or the completion, and its answer was lost: the script sent again is its writer's own (IDEM-STORE-1, IDEM-STORE-12, IDEM-LEASE-2)", async () => {
    const redis = client();
    const store = new RedisStore(redis);
    const busy = client();
    const killer = client();
    // The kind of write to lose the answer of: "claim" (a new record) or "completion".
    let lose = null;
    const losing = {
      load: (key) => store.load(key),
      apply: async (key, write, now, info) => {
        const kind = write.expect === null ? "claim" : info?.outcome !== undefined ? "completion" : "other";
        if (lose !== kind) return store.apply(key, write, now, info);
        lose = null;
        const id = await redis.client("ID");
        // Redis is busy; the write, then the kill of its connection, queue up behind: Redis
        // makes the write, then closes the connection before its answer goes out.
        busy.eval(BUSY, 0, "300").catch(() => {});
        await sleep(40);
        const applied = store.apply(key, write, now, info);
        await sleep(40);
        killer.client("KILL", "ID", String(id)).catch(() => {});
        return applied;
      },
    };
    let runs = 0;
    const handler = withIdempotency(async () => new Response(`order ${++runs}`, { status: 201 }), { store: losing, principal: "none", lease: 60_000 });
    for (const kind of ["claim", "completion"]) {
      for (let round = 0; round < 3; round++) {
        const key = randomUUID();
        const before = runs;
        lose = kind;
        const first = await handler(post(key));
        assert.equal(lose, null, `${kind}, round ${round}: the fault was met`);
        assert.equal(first.status, 201, `${kind}, round ${round}: ${await first.clone().text()}`);
        assert.equal(first.headers.get("idempotent-replayed"), null, `${kind}, round ${round}: its own answer, not a replay`);
        assert.equal(await first.text(), `order ${before + 1}`);
        const retry = await handler(post(key));
        assert.equal(retry.status, 201);
        assert.equal(retry.headers.get("idempotent-replayed"), "true");
        assert.equal(await retry.text(), `order ${before + 1}`);
        assert.equal(runs, before + 1);
      }
    }
  });

  test("retries that arrive together once a lease has ended take it over once, though their writes are alike to the byte (IDEM-CONC-1, IDEM-LEASE-2)", async () => {
    const clock = manualClock(Date.now());
    // Two processes' stores, each on a connection of its own.
    const stores = [new RedisStore(client()), new RedisStore(client())];
    let runs = 0;
    const handlers = stores.map((store) =>
      withIdempotency(
        async () => {
          const id = ++runs;
          // The first attempt never ends: its lease runs out.
          if (id === 1) await new Promise(() => {});
          await sleep(30);
          return new Response(`order ${id}`, { status: 201 });
        },
        { store, principal: "none", lease: 1_000, now: clock },
      ),
    );
    for (let round = 0; round < 3; round++) {
      runs = 0;
      const key = randomUUID();
      void handlers[0](post(key));
      while (runs === 0) await sleep(5);
      clock.advance(1_500);
      // The same millisecond for all of them: each takeover writes the same record.
      const answers = await Promise.all(Array.from({ length: 8 }, (_, i) => handlers[i % 2](post(key))));
      const statuses = answers.map((a) => a.status).sort();
      assert.equal(runs, 2, `round ${round}: ${runs - 1} takeovers ran (${statuses})`);
      assert.equal(statuses.filter((s) => s === 201).length, 1, `round ${round}: ${statuses}`);
    }
  });
});
