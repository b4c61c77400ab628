// `npm run bench` (second part): requests per second of one Node process with each store
// (MemoryStore, RedisStore, PostgresStore; Redis and Postgres private local servers, started
// here like the tests start them), fresh keys and replays, with 1 and with 64 requests in
// flight. Build first (`npm run build`; the servers come from `cargo xtask setup`).
//
// Workload: `Idempotency#handle` with a nested JSON body of about 200 bytes built fresh for
// every request, a handler that answers 201 with a small JSON body, and the reply parsed back
// into an object. Each phase runs for a time window (default 3 s); the store grows through the
// fresh phase (every request is a new key), and the replay phase replays the keys the fresh
// phase stored, in order. Redis and Postgres run without persistence (no fsync, no RDB/AOF):
// the numbers are the store's round trips and the engine, not the disk.
//
// Usage: node bench/stores.mjs [SECONDS]
import { Idempotency, MemoryStore } from "idem";
import { PostgresStore } from "idem/postgres";
import { RedisStore } from "idem/redis";
import Redis from "ioredis";
import pg from "pg";
import { startPostgres, startRedis } from "../test/servers.mjs";

const WINDOW_MS = Number(process.argv[2] ?? 3) * 1000;
const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** A nested order of about 200 bytes, built fresh for each request. */
function bodyOf(i) {
  return encoder.encode(
    JSON.stringify({
      customer: { id: `cus_${i % 977}`, tier: i % 3 === 0 ? "gold" : "basic" },
      items: [
        { sku: `sku_${i % 31}`, qty: 1 + (i % 4), price: { amount: 1999, currency: "eur" } },
        { sku: `sku_${i % 17}`, qty: 2, price: { amount: 499, currency: "eur" } },
      ],
      shipping: { method: "standard", address: { city: "Lyon", zip: "69001" } },
      note: null,
    }),
  );
}

const answer = encoder.encode(JSON.stringify({ id: "ord_1", status: "created" }));

async function request(idem, run, key, i) {
  const reply = await idem.handle(
    { method: "POST", target: "/orders", key: `"${run}-${key}"`, contentType: "application/json", body: bodyOf(i) },
    () => ({ status: 201, headers: { "content-type": "application/json" }, body: answer }),
  );
  if (reply.status !== 201) throw new Error(`unexpected ${reply.status}: ${decoder.decode(reply.body)}`);
  JSON.parse(decoder.decode(reply.body));
}

/** Runs requests for one window with `inFlight` at a time: fresh keys from 0 (or, for
 * replays, the first `keys` keys again, round and round). Resolves to [requests/s, keys]. */
async function phase(idem, run, inFlight, replayOf) {
  let next = 0;
  let done = 0;
  const end = performance.now() + WINDOW_MS;
  const start = performance.now();
  const worker = async () => {
    while (performance.now() < end) {
      const i = next++;
      const key = replayOf === undefined ? i : i % replayOf;
      await request(idem, run, key, key);
      done++;
    }
  };
  await Promise.all(Array.from({ length: inFlight }, worker));
  const seconds = (performance.now() - start) / 1000;
  return [done / seconds, next];
}

const redisServer = await startRedis();
const pgServer = await startPostgres();
const redis = new Redis(redisServer.url);
const pool = new pg.Pool({ connectionString: pgServer.url, max: 64 });
const postgres = new PostgresStore(pool);
await postgres.migrate();

const stores = [
  ["MemoryStore (in the module)", () => new MemoryStore()],
  ["RedisStore (ioredis, local redis-server 7)", () => new RedisStore(redis)],
  ["PostgresStore (pg, local Postgres 15)", () => postgres],
];

const rows = [];
let run = 0;
try {
  for (const inFlight of [1, 64]) {
    for (const [name, make] of stores) {
      run++;
      const idem = new Idempotency({ store: make(), principal: "none" });
      const [fresh, keys] = await phase(idem, run, inFlight);
      const [replay] = await phase(idem, run, inFlight, keys);
      rows.push({ name, inFlight, fresh, replay, keys });
    }
  }
} finally {
  redis.disconnect();
  await pool.end();
  await redisServer.stop();
  await pgServer.stop();
}

const fmt = (n) => Math.round(n).toLocaleString("en-US").padStart(8);
console.log(`\nStores, one Node process (${process.version}), ${WINDOW_MS / 1000} s per phase; requests per second (store size at the end of the fresh phase):\n`);
console.log("| store | in flight | fresh keys | replays | keys stored |");
console.log("|---|---:|---:|---:|---:|");
for (const r of rows) console.log(`| ${r.name} | ${r.inFlight} | ${fmt(r.fresh)} | ${fmt(r.replay)} | ${r.keys.toLocaleString("en-US")} |`);
