// The store tests (`idem/store-tests`: IDEM-STORE-1, IDEM-STORE-3, IDEM-STORE-4, IDEM-STORE-5,
// IDEM-STORE-6, IDEM-TTL-1..4, IDEM-LEASE-4) against every store in this package: the MemoryStore
// inside the module (and sealed, outside it), and RedisStore and PostgresStore on private servers (started here from
// the Debian packages, on 127.0.0.1, on ports the OS chose, with data in a temporary
// directory, and stopped at the end whatever happens). The Durable Object store passes the
// same tests under workerd, in examples/worker.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { createServer } from "node:net";
import { MemoryStore, storeTimeoutMs, withIdempotency } from "idem";
import { RedisStore } from "idem/redis";
import { PostgresStore } from "idem/postgres";
import { storeTests } from "idem/store-tests";
import Redis from "ioredis";
import pg from "pg";
import { freePort, startPostgres, startRedis } from "./servers.mjs";

/** The seal of the sealed runs of the store tests. */
const SEAL = { keys: [{ id: "kit", key: new Uint8Array(32).fill(5) }] };

describe("MemoryStore", () => {
  // One process: two `open()`s are two stores, which share nothing.
  storeTests(test, { name: "MemoryStore", open: () => new MemoryStore(), shared: false });
  // Every rule holds on sealed records too (IDEM-SEAL-1).
  storeTests(test, { name: "MemoryStore, sealed", open: () => new MemoryStore({ seal: SEAL }), shared: false });
});

describe("RedisStore", () => {
  let server;
  const clients = [];
  const client = (url, options) => {
    const c = new Redis(url, options);
    // The outage store's client reports its refused connections here, not as unhandled.
    c.on("error", () => {});
    clients.push(c);
    return c;
  };
  before(async () => {
    server = await startRedis();
  });
  after(async () => {
    for (const c of clients) c.disconnect();
    await server?.stop();
  });
  storeTests(test, {
    name: "RedisStore",
    // Each store has its own connection: the racing writes really interleave in the server.
    open: () => new RedisStore(client(server.url)),
    outage: async () =>
      new RedisStore(client(`redis://127.0.0.1:${await freePort()}`, { maxRetriesPerRequest: 0, enableOfflineQueue: false, retryStrategy: () => null, lazyConnect: true })),
    selfExpiring: true,
  });

  // Every rule holds on sealed records too (IDEM-SEAL-1).
  storeTests(test, {
    name: "RedisStore, sealed",
    open: () => new RedisStore(client(server.url), { seal: SEAL }),
    selfExpiring: true,
  });

  test("RedisStore: records are hashes under a hash-tagged key, with the key's expiry as their time-to-live (IDEM-STORE-6)", async () => {
    const redis = client(server.url);
    const store = new RedisStore(redis, { prefix: "app:" });
    assert.equal(store.redisKey("k"), "app:{k}");
    const now = Date.now();
    const value = new Uint8Array([1, 2, 3]);
    assert.equal(await store.apply("k", { expect: null, value, version: "5", deadline: now + 60_000, expires: now + 60_000 }, now), true);
    assert.deepEqual(await redis.hgetall("app:{k}"), { v: "5", r: "\u0001\u0002\u0003" });
    const ttl = await redis.pttl("app:{k}");
    assert.ok(ttl > 58_000 && ttl <= 60_000, `pttl ${ttl}: from expires, not from the deadline`);
  });

  test("RedisStore: once a response's retention ends its bytes are gone from Redis, while the key still answers 410 (IDEM-STORE-9)", async () => {
    const redis = client(server.url);
    const store = new RedisStore(redis, { prefix: "secret:" });
    const SECRET = "card ending 4242, Jane Doe, 1 Main St";
    const handler = withIdempotency(async () => new Response(SECRET, { status: 201 }), {
      store,
      principal: "none",
      responseTtl: 400,
      keyTtl: 3_600_000,
    });
    const post = () => new Request("http://x.test/orders", { method: "POST", headers: { "idempotency-key": '"k"' }, body: "{}" });
    const dump = async () => {
      const keys = await redis.keys("secret:*");
      let contents = "";
      for (const key of keys) for (const value of Object.values(await redis.hgetall(key))) contents += value;
      return { keys: keys.length, contents };
    };
    assert.equal((await handler(post())).status, 201);
    assert.equal(await (await handler(post())).text(), SECRET);
    assert.ok((await dump()).contents.includes(SECRET), "kept while it is replayed");
    const record = (await redis.keys("secret:*")).find((k) => !k.endsWith(":response"));
    const ttl = await redis.pttl(record);
    assert.ok(ttl > 3_500_000, `the record's time-to-live is the key's: ${ttl}`);
    await new Promise((resolve) => setTimeout(resolve, 600));
    const after = await dump();
    assert.ok(!after.contents.includes(SECRET), "the response's bytes are still in Redis after its retention ended");
    assert.equal(after.keys, 1, "the key's record stays");
    assert.equal((await handler(post())).status, 410, "a late retry is refused, not run again");
  });
});

test("RedisStore at maxmemory (noeviction) is full: a new key is refused 503 store-full, nothing runs, a stored key still replays, and a handler that ran meanwhile is recorded (IDEM-STORE-3)", async () => {
  const full = await startRedis();
  const redis = new Redis(full.url);
  try {
    let runs = 0;
    let started;
    const running = new Promise((resolve) => (started = resolve));
    let finish;
    const gate = new Promise((resolve) => (finish = resolve));
    const handler = withIdempotency(
      async (request) => {
        const id = ++runs;
        if (new URL(request.url).pathname === "/slow") {
          started();
          await gate;
        }
        return new Response(`order ${id}`, { status: 201 });
      },
      { store: new RedisStore(redis), principal: "none" },
    );
    const post = (key, path = "/orders") => new Request(`http://x.test${path}`, { method: "POST", headers: { "idempotency-key": `"${key}"` }, body: "{}" });
    assert.equal((await handler(post("before"))).status, 201);
    // A handler is running when Redis fills up.
    const during = handler(post("during", "/slow"));
    await running;
    const used = Number(/used_memory:(\d+)/.exec(await redis.info("memory"))[1]);
    await redis.config("SET", "maxmemory", String(used));
    await redis.set("ballast", "x".repeat(64 * 1024)).catch(() => {});
    const refused = await handler(post("after"));
    assert.equal(refused.status, 503);
    assert.equal((await refused.json()).type, "urn:idem:problem:store-full");
    assert.ok(refused.headers.has("retry-after"));
    assert.equal(runs, 2);
    const replay = await handler(post("before"));
    assert.equal(replay.headers.get("idempotent-replayed"), "true");
    // Its completion is a write to a record Redis holds: taken, so that the key is not left
    // to its lease and run again.
    finish();
    const done = await during;
    assert.equal(done.status, 201);
    assert.equal(await done.text(), "order 2");
    const again = await handler(post("during", "/slow"));
    assert.equal(again.headers.get("idempotent-replayed"), "true", await again.clone().text());
    assert.equal(await again.text(), "order 2");
    assert.equal(runs, 2);
  } finally {
    redis.disconnect();
    await full.stop();
  }
});

test("RedisStore: a claim whose answer is lost lands late and is withdrawn before the 503; the retry runs at once, once (IDEM-STORE-12)", async () => {
  const server = await startRedis();
  const redis = new Redis(server.url);
  const admin = new Redis(server.url);
  try {
    const store = new RedisStore(redis, { timeout: 150 });
    // Redis holds every write from just before the claim for longer than a call may take:
    // the claim is sent, times out, and is written when the pause ends.
    let pause = true;
    const pausing = {
      load: (key) => store.load(key),
      apply: async (key, write, now) => {
        if (pause) {
          pause = false;
          await admin.client("PAUSE", "600", "WRITE");
        }
        return store.apply(key, write, now);
      },
    };
    let runs = 0;
    const handler = withIdempotency(async () => new Response(`order ${++runs}`, { status: 201 }), { store: pausing, principal: "none" });
    const post = () => new Request("http://x.test/orders", { method: "POST", headers: { "idempotency-key": '"late"' }, body: "{}" });
    const refused = await handler(post());
    assert.equal(refused.status, 503);
    assert.equal((await refused.json()).type, "urn:idem:problem:store-unavailable");
    assert.equal(runs, 0);
    // A write on the same connection is done once the claim and what followed it are.
    await redis.set("after-the-pause", "1");
    const retry = await handler(post());
    assert.equal(retry.status, 201, "the late claim holds the key");
    assert.equal(await retry.text(), "order 1");
    assert.equal(runs, 1);
  } finally {
    redis.disconnect();
    admin.disconnect();
    await server.stop();
  }
});

describe("PostgresStore", () => {
  let server;
  const pools = [];
  const pool = (url, options = {}) => {
    const p = new pg.Pool({ connectionString: url, max: 8, ...options });
    // An idle client that loses its server reports here instead of crashing the test.
    p.on("error", () => {});
    pools.push(p);
    return p;
  };
  before(async () => {
    server = await startPostgres();
    await new PostgresStore(pool(server.url)).migrate();
  });
  after(async () => {
    for (const p of pools) await p.end().catch(() => {});
    await server?.stop();
  });
  storeTests(test, {
    name: "PostgresStore",
    // Each store has its own pool: the racing writes come over separate connections.
    open: () => new PostgresStore(pool(server.url)),
    outage: async () => new PostgresStore(pool(`postgres://idem@127.0.0.1:${await freePort()}/postgres`, { connectionTimeoutMillis: 2000 })),
  });

  storeTests(test, {
    name: "PostgresStore, sealed",
    open: () => new PostgresStore(pool(server.url), { seal: SEAL }),
  });

  test("PostgresStore: the migration runs again without harm, and the sweep goes through the deadline index", async () => {
    const p = pool(server.url);
    await new PostgresStore(p).migrate();
    await p.query("SET enable_seqscan = off");
    const { rows } = await p.query("EXPLAIN SELECT key, version, value FROM idem_records WHERE deadline <= 1 ORDER BY deadline LIMIT 10");
    assert.match(rows.map((r) => r["QUERY PLAN"]).join("\n"), /idem_records_deadline/);
  });
});

/** A TCP server on 127.0.0.1 that accepts connections and never answers (a store behind a
 * partition, or hung): `{ url(scheme), close() }`. */
async function silentServer() {
  const sockets = new Set();
  const server = createServer((s) => {
    sockets.add(s);
    s.on("error", () => {});
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  return {
    port,
    close: () => {
      for (const s of sockets) s.destroy();
      return new Promise((resolve) => server.close(resolve));
    },
  };
}

/** A store whose server never answers fails each call after `timeout` with IDEM-STORE-4, and
 * a request on it is answered 503 problem+json without running its handler (IDEM-STORE-4). */
async function stopsAnswering(open) {
  const silent = await silentServer();
  try {
    const store = open(silent.port, 150);
    const started = Date.now();
    await assert.rejects(store.load("k"), (e) => e.code === "IDEM-STORE-4" && /within 150 ms/.test(e.message));
    const took = Date.now() - started;
    assert.ok(took >= 140, `the call waited its timeout (${took} ms)`);
    let ran = 0;
    const handler = withIdempotency(
      async () => {
        ran++;
        return new Response("made", { status: 201 });
      },
      { store, principal: () => "p" },
    );
    const res = await handler(new Request("http://x/orders", { method: "POST", headers: { "idempotency-key": '"k1"' }, body: "{}" }));
    assert.equal(res.status, 503);
    assert.match(res.headers.get("content-type"), /^application\/problem\+json/);
    assert.equal(ran, 0);
  } finally {
    await silent.close();
  }
}

test("a store's calls are bounded by idem-core's timeout unless its options say otherwise", () => {
  assert.equal(storeTimeoutMs(), 2000);
  for (const timeout of [0, -1, 1.5, Number.NaN, Infinity, "100"]) {
    assert.throws(() => new PostgresStore({ query() {}, connect() {} }, { timeout }), (e) => e.code === "IDEM-JS-1" && /options.timeout/.test(e.message));
  }
});

test("RedisStore: a Redis that stops answering fails the call in time, and the request gets 503 (IDEM-STORE-10)", { timeout: 10_000 }, async () => {
  const clients = [];
  try {
    await stopsAnswering((port, timeout) => {
      const c = new Redis(`redis://127.0.0.1:${port}`, { lazyConnect: false });
      c.on("error", () => {});
      clients.push(c);
      return new RedisStore(c, { timeout });
    });
  } finally {
    for (const c of clients) c.disconnect();
  }
});

test("PostgresStore: a Postgres that stops answering fails the call in time, and the request gets 503 (IDEM-STORE-10)", { timeout: 10_000 }, async () => {
  const pools = [];
  try {
    await stopsAnswering((port, timeout) => {
      const p = new pg.Pool({ connectionString: `postgres://idem@127.0.0.1:${port}/postgres`, max: 2 });
      p.on("error", () => {});
      pools.push(p);
      return new PostgresStore(p, { timeout });
    });
  } finally {
    // The pool's connections wait on a server that never answers: not ended, dropped.
    for (const p of pools) p.end().catch(() => {});
  }
});
