// Sealed records (IDEM-SEAL-1..3) in a MemoryStore and on private Redis and Postgres servers: nothing of a
// response is stored in clear; keys rotate (the first seals, any opens); a record under a
// key the store does not hold, or copied under another key, is answered 500 record-sealed
// and never executed; and the reference server (Rust, `idem-conformance serve
// --seal-env`) and a Node server read each other's sealed records from one Redis and one
// table.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { dirname, join } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { MemoryStore, recordSealer, unopenedDue, withIdempotency } from "idem";
import { PostgresStore } from "idem/postgres";
import { RedisStore } from "idem/redis";
import Redis from "ioredis";
import pg from "pg";
import { conformanceBinary } from "./conformance.mjs";
import { startPostgres, startRedis } from "./servers.mjs";

const here = dirname(fileURLToPath(import.meta.url));
/** What an order's response carries: personal data. */
const SECRET = "Ada Lovelace, 12 St James's Square";
const key = (byte) => new Uint8Array(32).fill(byte);
const b64 = (byte) => Buffer.from(key(byte)).toString("base64");
const SEALED = "urn:idem:problem:record-sealed";

/** A guarded order handler on `store`, counting its runs in `runs.n`. */
function orders(store, runs) {
  return withIdempotency(
    async (request) => {
      const body = await request.json();
      runs.n++;
      return Response.json({ order: runs.n, sku: body.sku, ship_to: SECRET }, { status: 201, headers: { "x-card-last4": "card-4242" } });
    },
    { store, principal: () => "acct_1" },
  );
}

const post = (k) =>
  new Request("http://shop.test/orders", {
    method: "POST",
    headers: { "idempotency-key": `"${k}"`, "content-type": "application/json" },
    body: JSON.stringify({ sku: "fountain-pen" }),
  });

async function answer(handler, k) {
  const r = await handler(post(k));
  return { status: r.status, replayed: r.headers.get("idempotent-replayed"), type: r.headers.get("content-type"), body: await r.text() };
}

const inClear = (values, needle) => values.some((v) => Buffer.from(v).includes(needle));

/** The checks every sealed store passes: `open(keys, more)` makes a store with those seal
 * keys (and more seal options),
 * `dump()` resolves to every stored value, `move(from, to)` copies one key's record
 * under another. */
function sealedStoreTests({ open, dump, move }) {
  test("records are sealed: answered and replayed, with nothing of them in clear in the store (IDEM-SEAL-1)", async () => {
    const runs = { n: 0 };
    const first = await answer(orders(open([{ id: "2026-05", key: key(1) }]), runs), "dump");
    assert.equal(first.status, 201, first.body);
    assert.ok(first.body.includes(SECRET));
    const again = await answer(orders(open([{ id: "2026-05", key: key(1) }]), runs), "dump");
    assert.deepEqual([again.status, again.replayed, again.body], [201, "true", first.body]);
    assert.equal(runs.n, 1);
    const values = await dump();
    assert.ok(values.length > 0);
    for (const clear of [SECRET, "card-4242", "x-card-last4", "fountain-pen"]) assert.ok(!inClear(values, clear), `${clear} is stored in clear`);
  });

  test("keys rotate: the first seals, any opens; a dropped key's records are refused, never run (IDEM-SEAL-2, IDEM-SEAL-3)", async () => {
    const runs = { n: 0 };
    const old = [{ id: "2026-05", key: key(1) }];
    const rotated = [{ id: "2026-11", key: key(2) }, ...old];
    const next = [{ id: "2026-11", key: key(2) }];
    const a = await answer(orders(open(old), runs), "rot-a");
    assert.equal((await answer(orders(open(rotated), runs), "rot-a")).body, a.body);
    const b = await answer(orders(open(rotated), runs), "rot-b");
    assert.equal(b.status, 201);
    assert.equal((await answer(orders(open(next), runs), "rot-b")).body, b.body);
    const refused = await answer(orders(open(next), runs), "rot-a");
    assert.equal(refused.status, 500);
    assert.equal(refused.type, "application/problem+json");
    assert.equal(JSON.parse(refused.body).type, SEALED);
    // A store without keys refuses every sealed record too.
    const bare = await answer(orders(open(undefined), runs), "rot-b");
    assert.equal(JSON.parse(bare.body).type, SEALED);
    assert.equal(runs.n, 2);
  });

  test("a record in clear is refused by a sealing store, unless it reads those while moving to sealing (IDEM-SEAL-3)", async () => {
    const runs = { n: 0 };
    const clear = await answer(orders(open(undefined), runs), "clear");
    assert.equal(clear.status, 201);
    const refused = await answer(orders(open([{ id: "k", key: key(4) }]), runs), "clear");
    assert.deepEqual([refused.status, JSON.parse(refused.body).type], [500, SEALED]);
    const moving = await answer(orders(open([{ id: "k", key: key(4) }], { readClear: true }), runs), "clear");
    assert.deepEqual([moving.replayed, moving.body], ["true", clear.body]);
    assert.equal(runs.n, 1);
  });

  test("a sealed record copied under another key does not open there (IDEM-SEAL-3)", async () => {
    const runs = { n: 0 };
    const keys = [{ id: "k", key: key(3) }];
    assert.equal((await answer(orders(open(keys), runs), "move-from")).status, 201);
    await move("move-from", "move-to");
    const refused = await answer(orders(open(keys), runs), "move-to");
    assert.deepEqual([refused.status, JSON.parse(refused.body).type], [500, SEALED]);
    assert.equal(runs.n, 1);
  });
}

/** The one stored key among `keys` whose record is the Idempotency-Key `k`'s (the storage
 * key ends with it; in Redis, inside the hash tag's braces). */
function storedKeyOf(keys, k) {
  const found = keys.filter((s) => s.endsWith(k) || s.endsWith(`${k}}`));
  assert.equal(found.length, 1, `records for ${k} among ${keys.join(", ")}`);
  return found[0];
}

/** `store` with the storage keys of its writes seen: the engine writes a sealed
 * MemoryStore through `apply`, as any store. */
function watched(store) {
  const keys = new Set();
  const apply = store.apply.bind(store);
  store.apply = (key, write, now) => {
    keys.add(key);
    return apply(key, write, now);
  };
  return { store, keyOf: (k) => storedKeyOf([...keys], k) };
}

test("a due record a store cannot open is deleted once its key need no longer be kept, due again then until it has (unopenedDue, IDEM-SEAL-3)", () => {
  const expires = 10_000;
  assert.equal(unopenedDue(9_999, expires), expires);
  assert.equal(unopenedDue(expires, expires), undefined);
  assert.equal(unopenedDue(20_000, expires), undefined);
});

describe("sealed MemoryStore", () => {
  const ORDER = { responseTtl: 60_000, keyTtl: 3_600_000 };

  test("records are held sealed: answered and replayed, with nothing of them in clear (IDEM-SEAL-1)", async () => {
    const runs = { n: 0 };
    const { store, keyOf } = watched(new MemoryStore({ seal: { keys: [{ id: "2026-05", key: key(1) }] } }));
    const handler = orders(store, runs);
    const first = await answer(handler, "a");
    assert.equal(first.status, 201, first.body);
    assert.ok(first.body.includes(SECRET));
    const again = await answer(handler, "a");
    assert.deepEqual([again.status, again.replayed, again.body], [201, "true", first.body]);
    assert.equal(runs.n, 1);
    const held = store.stored(keyOf("a"));
    assert.equal(Buffer.from(held.subarray(0, 11)).toString("latin1"), "iS\x01\x072026-05");
    for (const clear of [SECRET, "card-4242", "x-card-last4", "fountain-pen"]) assert.ok(!inClear([held], clear), `${clear} is held in clear`);
    // The same record in a MemoryStore without a seal shows it all; that one is driven
    // inside the module, never through `apply`.
    const plain = new MemoryStore();
    const applied = [];
    plain.apply = (...args) => applied.push(args);
    assert.equal((await answer(orders(plain, runs), "a")).status, 201);
    assert.ok(inClear([plain.stored(keyOf("a"))], SECRET));
    assert.equal(applied.length, 0);
    assert.equal(store.size, 1);
  });

  test("keys rotate while it runs: the first seals, any opens; a dropped key's records are refused, never run (IDEM-SEAL-2, IDEM-SEAL-3)", async () => {
    const runs = { n: 0 };
    const old = [{ id: "2026-05", key: key(1) }];
    const { store, keyOf } = watched(new MemoryStore({ seal: { keys: old } }));
    const handler = orders(store, runs);
    const a = await answer(handler, "rot-a");
    assert.ok(store.replaceSeal({ keys: [{ id: "2026-11", key: key(2) }, ...old] }));
    assert.equal((await answer(handler, "rot-a")).body, a.body);
    const b = await answer(handler, "rot-b");
    assert.equal(b.status, 201);
    assert.equal(Buffer.from(store.stored(keyOf("rot-b")).subarray(4, 11)).toString(), "2026-11");
    assert.ok(store.replaceSeal({ keys: [{ id: "2026-11", key: key(2) }] }));
    assert.equal((await answer(handler, "rot-b")).body, b.body);
    const refused = await answer(handler, "rot-a");
    assert.equal(refused.status, 500);
    assert.equal(refused.type, "application/problem+json");
    assert.equal(JSON.parse(refused.body).type, SEALED);
    assert.equal(runs.n, 2);
    assert.equal(new MemoryStore().replaceSeal({ keys: old }), false, "a store made without a seal has none to replace");
  });

  test("expiry and limits work on the sealed bytes, without the keys that sealed them (IDEM-STORE-3, IDEM-STORE-9)", async () => {
    const runs = { n: 0 };
    const { store, keyOf } = watched(new MemoryStore({ maxEntries: 1, seal: { keys: [{ id: "old", key: key(1) }] } }));
    const handler = withIdempotency(async () => (runs.n++, new Response(SECRET, { status: 201 })), { store, principal: () => "acct_1", ...ORDER });
    assert.equal((await answer(handler, "x")).status, 201);
    assert.equal((await answer(handler, "y")).status, 503, "full: a new key is refused");
    const whole = store.stored(keyOf("x")).byteLength;
    store.replaceSeal({ keys: [{ id: "new", key: key(2) }] });
    assert.equal(store.sweep(Date.now() + ORDER.responseTtl + 1000), 1);
    assert.ok(store.stored(keyOf("x")).byteLength + SECRET.length <= whole, "the response's sealed bytes are gone");
    assert.equal(store.size, 1);
    assert.equal(store.sweep(Date.now() + ORDER.keyTtl + 1000), 1);
    assert.equal(store.size, 0);
    assert.equal((await answer(handler, "y")).status, 201);
    assert.equal(runs.n, 2);
  });

  test("sealing options are checked when the store is made (IDEM-JS-1)", async () => {
    assert.throws(() => new MemoryStore({ seal: { keys: [] } }), (e) => e instanceof RangeError && e.code === "IDEM-JS-1");
    // A CryptoKey that cannot seal (the first) or cannot open (any) would fail every request.
    const only = (usages) => crypto.subtle.importKey("raw", key(4), "AES-GCM", false, usages);
    for (const keys of [[{ id: "a", key: await only(["encrypt"]) }], [{ id: "a", key: await only(["decrypt"]) }], [{ id: "a", key: key(1) }, { id: "b", key: await only(["encrypt"]) }]]) {
      assert.throws(() => new MemoryStore({ seal: { keys } }), (e) => e instanceof RangeError && e.code === "IDEM-JS-1", keys.map((k) => k.id).join());
    }
    assert.ok(new MemoryStore({ seal: { keys: [{ id: "a", key: key(1) }, { id: "b", key: await only(["decrypt"]) }] } }));
  });

  test("the key bytes are the store's from when it is made: clearing the caller's buffer after seals nothing under zeros (IDEM-SEAL-1)", async () => {
    // A view and an ArrayBuffer, each zeroed once the store has it, as a careful caller does.
    for (const [secret, clear] of [[key(7), (k) => k.fill(0)], [key(7).buffer, (k) => new Uint8Array(k).fill(0)]]) {
      const { store, keyOf } = watched(new MemoryStore({ seal: { keys: [{ id: "k7", key: secret }] } }));
      clear(secret);
      const runs = { n: 0 };
      assert.equal((await answer(orders(store, runs), "z")).status, 201);
      const held = store.stored(keyOf("z"));
      await assert.doesNotReject(recordSealer({ keys: [{ id: "k7", key: key(7) }] }).open(keyOf("z"), held), "opens with the key as it was");
      await assert.rejects(recordSealer({ keys: [{ id: "k7", key: key(0) }] }).open(keyOf("z"), held), (e) => e.code === "IDEM-SEAL-3");
      const again = await answer(orders(store, runs), "z");
      assert.deepEqual([again.status, again.replayed, runs.n], [201, "true", 1]);
    }
  });
});

describe("sealed RedisStore", () => {
  let server;
  const clients = [];
  const client = () => {
    const c = new Redis(server.url);
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
  sealedStoreTests({
    open: (keys, more) => new RedisStore(client(), keys === undefined ? {} : { seal: { keys, ...more } }),
    dump: async () => {
      const c = client();
      const values = [];
      for (const k of await c.keys("*")) {
        values.push(Buffer.from(k));
        const hash = await c.hgetallBuffer(k);
        for (const [field, value] of Object.entries(hash)) values.push(Buffer.from(field), value);
      }
      return values;
    },
    move: async (from, to) => {
      const c = client();
      const source = storedKeyOf(await c.keys("idem:*"), from);
      const target = `${source.slice(0, -from.length - 1)}${to}}`;
      assert.equal(await c.copy(source, target), 1);
    },
  });

  test("sealing options are checked when the store is made (IDEM-JS-1)", () => {
    const c = client();
    for (const seal of [{}, { keys: [] }, { keys: [{ id: "a", key: key(1).subarray(16) }] }, { keys: [{ id: "a b", key: key(1) }] }, { keys: [{ id: "a", key: key(1) }, { id: "a", key: key(2) }] }]) {
      assert.throws(() => new RedisStore(c, { seal }), (e) => e instanceof RangeError && e.code === "IDEM-JS-1", JSON.stringify(seal));
    }
  });
});

describe("sealed PostgresStore", () => {
  let server;
  let pool;
  before(async () => {
    server = await startPostgres();
    pool = new pg.Pool({ connectionString: server.url, max: 8 });
    // An idle client that loses its server reports here instead of crashing the test.
    pool.on("error", () => {});
    await new PostgresStore(pool).migrate();
  });
  after(async () => {
    await pool?.end();
    await server?.stop();
  });
  sealedStoreTests({
    open: (keys, more) => new PostgresStore(pool, keys === undefined ? {} : { seal: { keys, ...more } }),
    dump: async () => (await pool.query("SELECT key, version, value FROM idem_records")).rows.map((r) => r.value),
    move: async (from, to) => {
      const keys = (await pool.query("SELECT key FROM idem_records")).rows.map((r) => r.key);
      const source = storedKeyOf(keys, from);
      const target = source.slice(0, -from.length) + to;
      const copied = await pool.query(
        "INSERT INTO idem_records (key, version, value, deadline, expires) SELECT $2, version, value, deadline, expires FROM idem_records WHERE key = $1",
        [source, target],
      );
      assert.equal(copied.rowCount, 1);
    },
  });

  test("a sweep defers the due records it cannot open to their keys' expiry, then deletes them", async () => {
    const store = new PostgresStore(pool, { seal: { keys: [{ id: "other", key: key(9) }] } });
    const day = 24 * 3600 * 1000;
    const soon = Date.now() + day + 60_000;
    const due = async (at) => Number((await pool.query("SELECT count(*) AS n FROM idem_records WHERE deadline <= $1", [at])).rows[0].n);
    const all = async () => Number((await pool.query("SELECT count(*) AS n FROM idem_records")).rows[0].n);
    const before = await due(soon);
    assert.ok(before >= 3, `${before} due`);
    // Two at a time: each sweep moves what it cannot read out of the way of the next.
    assert.equal(await store.sweep(soon, 2), 0, "nothing changed early");
    assert.equal(await due(soon), before - 2);
    for (let round = 0; round < 100 && (await due(soon)) > 0; round++) await store.sweep(soon, 2);
    assert.equal(await due(soon), 0);
    const kept = await all();
    assert.equal(await store.sweep(Date.now() + 8 * day), kept, "deleted once the keys expired");
    assert.equal(await all(), 0);
  });
});

/** A process that prints its base URL or port on its first line of stdout; `{ url, stop }`. */
function start(cmd, args, env, toUrl) {
  const child = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
  let err = "";
  child.stderr.on("data", (d) => (err += d));
  const exited = new Promise((resolve) => child.once("exit", resolve));
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    await exited;
  };
  return new Promise((resolve, reject) => {
    let out = "";
    child.stdout.on("data", (d) => {
      out += d;
      const line = out.split("\n")[0];
      if (out.includes("\n")) resolve({ url: toUrl(line), stop });
    });
    child.once("exit", (code) => reject(new Error(`${cmd} exited (${code}): ${err}`)));
  });
}

const rust = (store, seal) =>
  start(conformanceBinary(), ["serve", "--listen", "127.0.0.1:0", "--store", store, "--seal-env", "IDEM_SEAL"], { IDEM_SEAL: seal }, (line) => /(https?:\/\/\S+)/.exec(line)[1]);
const node = (kind, store, seal) =>
  start(process.execPath, [join(here, "fixtures", "orders-server.mjs"), kind, store], { IDEM_SEAL: seal, ORDER_DELAY_MS: "0" }, (line) => `http://127.0.0.1:${line.trim()}`);

/** POST /orders with key `k` to `base`: status, replay flag, body. */
async function order(base, k) {
  const r = await fetch(`${base}/orders`, {
    method: "POST",
    headers: { "idempotency-key": `"${k}"`, "content-type": "application/json" },
    body: JSON.stringify({ item: "fountain pen", ship_to: SECRET }),
  });
  return { status: r.status, replayed: r.headers.get("idempotent-replayed"), body: await r.text() };
}

describe("Rust and JavaScript read each other's sealed records", () => {
  const running = [];
  const servers = [];
  after(async () => {
    await Promise.all(running.map((p) => p.stop()));
    await Promise.all(servers.map((s) => s.stop()));
  });

  for (const kind of ["redis", "postgres"]) {
    test(`on one ${kind === "redis" ? "Redis" : "Postgres table"}, with keys rotated on one side (IDEM-SEAL-1, IDEM-SEAL-2, IDEM-SEAL-3)`, async () => {
      const server = kind === "redis" ? await startRedis() : await startPostgres();
      servers.push(server);
      if (kind === "postgres") {
        const pool = new pg.Pool({ connectionString: server.url });
        await new PostgresStore(pool).migrate();
        await pool.query("CREATE TABLE test_executions (n bigint NOT NULL); INSERT INTO test_executions VALUES (0);");
        await pool.end();
      }
      const k1 = `k1:${b64(1)}`;
      const k2 = `k2:${b64(2)}`;
      const r = await rust(server.url, k1);
      running.push(r);
      const n = await node(kind, server.url, `${k2},${k1}`);
      running.push(n);

      // Sealed by Rust (k1), replayed by Node; sealed by Node (k2), replayed by Rust only
      // once Rust holds k2 too.
      const byRust = await order(r.url, "made-in-rust");
      assert.equal(byRust.status, 201, byRust.body);
      assert.deepEqual(await order(n.url, "made-in-rust"), { ...byRust, replayed: "true" });
      const byNode = await order(n.url, "made-in-node");
      assert.equal(byNode.status, 201, byNode.body);
      const refused = await order(r.url, "made-in-node");
      assert.equal(refused.status, 500);
      assert.equal(JSON.parse(refused.body).type, SEALED);
      await r.stop();
      const r2 = await rust(server.url, `${k2},${k1}`);
      running.push(r2);
      assert.deepEqual(await order(r2.url, "made-in-node"), { ...byNode, replayed: "true" });
      assert.deepEqual(await order(r2.url, "made-in-rust"), { ...byRust, replayed: "true" });

      // Nothing of either response is in clear in the store.
      let values;
      if (kind === "redis") {
        const c = new Redis(server.url);
        values = [];
        // A record is a hash: `v` its version (in clear), `r` its bytes.
        for (const k of await c.keys("idem:*")) values.push((await c.hgetallBuffer(k)).r);
        c.disconnect();
      } else {
        const pool = new pg.Pool({ connectionString: server.url });
        values = (await pool.query("SELECT value FROM idem_records")).rows.map((row) => row.value);
        await pool.end();
      }
      assert.ok(values.length >= 2);
      assert.ok(!inClear(values, "Ada Lovelace") && !inClear(values, "fountain pen"));
      assert.ok(values.every((v) => v.subarray(0, 2).toString() === "iS"), "every record is sealed");
    });
  }
});
