// PostgresStore when its connections die or its pool runs out, on a private Postgres: a
// connection that dies as the pool hands it over fails the call, not the process; a call that
// gave up waiting for a connection sends nothing once one frees up (no claim held by nobody);
// and a completion whose transaction's connection died still releases its key.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { spawn } from "node:child_process";
import { createServer, connect } from "node:net";
import { fileURLToPath } from "node:url";
import { after, before, describe, test } from "node:test";
import { idempotencyOf, withIdempotency } from "idem";
import { PostgresStore } from "idem/postgres";
import pg from "pg";
import { freePort, startPostgres } from "./servers.mjs";

const post = (key) => new Request("http://orders.test/orders", { method: "POST", headers: { "idempotency-key": `"${key}"` }, body: "{}" });

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Resolves once every connection of `pool` is back, or fails after `ms`. */
async function allBack(pool, ms = 2_000) {
  const until = Date.now() + ms;
  while (pool.totalCount - pool.idleCount !== 0) {
    if (Date.now() > until) assert.fail(`${pool.totalCount - pool.idleCount} connection(s) still out`);
    await sleep(10);
  }
}

/**
 * A TCP proxy to Postgres on 127.0.0.1: `{ port, close() }`. Once a query containing `marker`
 * passes through a connection, the server's bytes on it are held back until the server closes
 * it, then passed on in one write: the reply to that query and the FATAL of its terminated
 * backend reach pg in one read, as they do when a backend is terminated just as it answers.
 */
async function holdingProxy(port, marker) {
  const sockets = new Set();
  const server = createServer((client) => {
    const upstream = connect(port, "127.0.0.1");
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("error", () => {});
      s.on("close", () => sockets.delete(s));
    }
    let held = null;
    client.on("data", (d) => {
      if (held === null && d.includes(marker)) held = [];
      upstream.write(d);
    });
    upstream.on("data", (d) => (held === null ? client.write(d) : held.push(d)));
    upstream.on("close", () => {
      if (held?.length) client.write(Buffer.concat(held));
      client.end();
    });
    client.on("close", () => upstream.destroy());
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    port: server.address().port,
    close: () => {
      for (const s of sockets) s.destroy();
      return new Promise((resolve) => server.close(resolve));
    },
  };
}

describe("PostgresStore: connections that die, and a pool with none to spare", () => {
  let server;
  let admin;
  const pools = [];
  const newPool = (options) => {
    const pool = new pg.Pool({ connectionString: server.url, ...options });
    // An idle client that loses its server reports here instead of failing the test.
    pool.on("error", () => {});
    pools.push(pool);
    return pool;
  };
  before(async () => {
    server = await startPostgres();
    admin = new pg.Client({ connectionString: server.url });
    admin.on("error", () => {});
    await admin.connect();
    await new PostgresStore(newPool({ max: 1 })).migrate();
  });
  after(async () => {
    for (const pool of pools) await pool.end().catch(() => {});
    await admin?.end().catch(() => {});
    await server?.stop();
  });

  test("a connection whose server's FATAL comes in the read that frees it fails the call waiting for it, not the process (IDEM-STORE-11)", async () => {
    const MARKER = "idem-handover";
    const proxy = await holdingProxy(server.port, MARKER);
    try {
      // Each way the store checks out a client: a transaction, and a call of the engine.
      const calls = {
        transaction: (store) => store.transaction({ storageKey: randomUUID(), attempt: "1" }, async (client) => client.query("SELECT 1")),
        load: (store) => store.load(randomUUID()),
      };
      for (let round = 0; round < 3; round++) {
        for (const [name, call] of Object.entries(calls)) {
          const pool = newPool({ connectionString: `postgres://idem@127.0.0.1:${proxy.port}/postgres`, max: 1 });
          const store = new PostgresStore(pool, { timeout: 5_000 });
          // The pool's one connection runs a query of its own; the store's call waits for it.
          const marker = pool.query(`SELECT '${MARKER}' AS marker`);
          const waiting = call(store).then(
            () => "done",
            (err) => err,
          );
          // Its reply is held at the proxy; the backend is terminated once it has answered, so
          // that the FATAL follows the reply in the same read. pg-pool hands the connection to
          // the store as it reads the reply, and pg emits the FATAL as an error right after.
          let pid;
          for (let i = 0; pid === undefined; i++) {
            if (i > 500) assert.fail("the marker query never reached the server");
            const { rows } = await admin.query(
              "SELECT pid FROM pg_stat_activity WHERE state = 'idle' AND query LIKE $1 AND pid <> pg_backend_pid()",
              [`%${MARKER}' AS marker%`],
            );
            pid = rows[0]?.pid;
            if (pid === undefined) await sleep(10);
          }
          await admin.query("SELECT pg_terminate_backend($1)", [pid]);
          assert.equal((await marker).rows[0].marker, MARKER, `${name}, round ${round}: the query before the FATAL was answered`);
          const outcome = await waiting;
          assert.ok(outcome instanceof Error, `${name}, round ${round}: the call on a dead connection failed (${outcome})`);
          // The dead connection was discarded, and the next call gets a live one.
          await allBack(pool);
          assert.equal(await store.load(randomUUID()), null);
          await pool.end();
        }
      }
    } finally {
      await proxy.close();
    }
  });

  test("a claim that gave up waiting for a connection is never made once one frees up: the retry runs as a first attempt (IDEM-STORE-10, IDEM-OUT-6)", async () => {
    const pool = newPool({ max: 1 });
    const store = new PostgresStore(pool, { timeout: 300 });
    let busy;
    // The pool's one connection is taken elsewhere just before the claim, which waits for it
    // past the store's timeout.
    const crowded = {
      load: (key) => store.load(key),
      apply: async (...args) => {
        busy ??= await pool.connect();
        return store.apply(...args);
      },
    };
    const contexts = [];
    const handler = withIdempotency(
      async (request) => {
        contexts.push(idempotencyOf(request));
        return new Response("made", { status: 201 });
      },
      { store: crowded, principal: "none", lease: 60_000 },
    );
    const key = randomUUID();
    const refused = await handler(post(key));
    assert.equal(refused.status, 503);
    assert.equal((await refused.json()).type, "urn:idem:problem:store-unavailable");
    assert.equal(contexts.length, 0, "nothing ran");
    // The connection frees up: the claim whose caller gave up must not be made now.
    busy.release();
    await allBack(pool);
    const { rows } = await pool.query("SELECT count(*)::int AS n FROM idem_records WHERE key LIKE $1", [`%${key}%`]);
    assert.equal(rows[0].n, 0, "a claim was made after its caller was told nothing ran");
    const retry = await handler(post(key));
    assert.equal(retry.status, 201, "the retry is refused as in progress");
    assert.equal(contexts.length, 1);
    assert.equal(contexts[0].recovered, false, "the retry took over a claim nobody held");
  });

  test("a completion whose transaction's connection died, failed or not kept, still releases its key: the retry runs (IDEM-STORE-11, IDEM-OUT-6)", async () => {
    const pool = newPool({ max: 4 });
    const store = new PostgresStore(pool);
    await pool.query("CREATE TABLE IF NOT EXISTS fault_orders (id bigserial PRIMARY KEY, key text NOT NULL)");
    for (const failure of ["answers 500", "throws"]) {
      const key = randomUUID();
      let runs = 0;
      const handler = withIdempotency(
        async (request) => {
          runs++;
          let died;
          const pid = await store.transaction(idempotencyOf(request), async (client) => {
            died = new Promise((resolve) => client.once("error", resolve));
            await client.query("INSERT INTO fault_orders (key) VALUES ($1)", [key]);
            return (await client.query("SELECT pg_backend_pid() AS pid")).rows[0].pid;
          });
          if (runs > 1) return new Response("made", { status: 201 });
          // The transaction's connection dies while the store holds it (a restart, an
          // idle-in-transaction timeout), and the handler then fails: its ROLLBACK fails too.
          await admin.query("SELECT pg_terminate_backend($1)", [pid]);
          await died;
          if (failure === "throws") throw new Error("payment provider down");
          return new Response("ledger unavailable", { status: 500 });
        },
        { store, principal: "none", lease: 60_000 },
      );
      if (failure === "throws") await assert.rejects(handler(post(key)), /payment provider down/);
      else assert.equal((await handler(post(key))).status, 500);
      const retry = await handler(post(key));
      assert.equal(retry.status, 201, `${failure}: the retry was refused as in progress`);
      assert.equal(runs, 2);
      const { rows } = await pool.query("SELECT count(*)::int AS n FROM fault_orders WHERE key = $1", [key]);
      assert.equal(rows[0].n, 1, `${failure}: only the retry's row committed`);
      await allBack(pool);
    }
  });

  test("a sweep that Postgres does not answer fails within the store's timeout, never waits without end (IDEM-STORE-10)", async () => {
    const pool = newPool({ max: 2 });
    const store = new PostgresStore(pool, { timeout: 300 });
    const locker = new pg.Client({ connectionString: server.url });
    await locker.connect();
    try {
      // The records' table locked by another session: the sweep's query waits on it.
      await locker.query("BEGIN");
      await locker.query("LOCK TABLE idem_records IN ACCESS EXCLUSIVE MODE");
      const started = Date.now();
      await assert.rejects(store.sweep(), (e) => e.code === "IDEM-STORE-4");
      assert.ok(Date.now() - started < 5_000, `the sweep waited ${Date.now() - started} ms`);
    } finally {
      await locker.query("ROLLBACK").catch(() => {});
      await locker.end().catch(() => {});
    }
    await allBack(pool, 5_000);
    assert.equal(typeof (await store.sweep()), "number");
  });

  test("a sweep meets a record it cannot read (damaged, or a newer format) and goes on: the records due after it expire (IDEM-REC-1, IDEM-STORE-9)", async () => {
    const pool = newPool({ max: 2 });
    const store = new PostgresStore(pool);
    const now = Date.now();
    const handler = withIdempotency(async () => new Response("made", { status: 201 }), { store, principal: "none", responseTtl: 1, keyTtl: 60_000, now: () => now });
    const keys = [randomUUID(), randomUUID()];
    for (const key of keys) assert.equal((await handler(post(key))).status, 201);
    // Due first, and not a record: the sweep reaches it before the others.
    await pool.query("INSERT INTO idem_records (key, version, value, deadline, expires) VALUES ($1, '1', $2, 0, $3)", [`damaged-${randomUUID()}`, Buffer.from([9, 9, 9]), now + 60_000]);
    const before = (await pool.query("SELECT count(*)::int AS n FROM idem_records WHERE deadline <= $1", [now + 10])).rows[0].n;
    assert.ok(before >= 3);
    await store.sweep(now + 10);
    const { rows } = await pool.query("SELECT key FROM idem_records WHERE deadline <= $1", [now + 10]);
    assert.deepEqual(rows.filter((r) => keys.some((k) => r.key.includes(k))), [], "the readable records due behind it expired");
  });
  test("a claim that Postgres writes after its call ran out of time is withdrawn before the 503; the retry runs at once, once (IDEM-STORE-12)", async () => {
    const store = new PostgresStore(newPool({ max: 4 }), { timeout: 600 });
    const locker = new pg.Client({ connectionString: server.url });
    locker.on("error", () => {});
    await locker.connect();
    try {
      // Just before the claim, another transaction inserts the same key and holds it for
      // longer than a call may take: the claim's insert waits for it in Postgres, its call
      // runs out of time, and it is written when that transaction rolls back. A delete sent
      // meanwhile finds nothing it can see.
      let released = null;
      const locking = {
        load: (key) => store.load(key),
        apply: async (key, write, now, info) => {
          if (released === null) {
            await locker.query("BEGIN");
            await locker.query("INSERT INTO idem_records (key, version, value, deadline, expires) VALUES ($1, 'other', ''::bytea, 0, 0)", [key]);
            released = sleep(900).then(() => locker.query("ROLLBACK"));
          }
          return store.apply(key, write, now, info);
        },
      };
      let runs = 0;
      const handler = withIdempotency(async () => new Response(`order ${++runs}`, { status: 201 }), { store: locking, principal: "none" });
      const key = randomUUID();
      const refused = await handler(post(key));
      assert.equal(refused.status, 503);
      assert.equal((await refused.json()).type, "urn:idem:problem:store-unavailable");
      assert.equal(runs, 0);
      await released;
      const retry = await handler(post(key));
      assert.equal(retry.status, 201, "the late claim holds the key");
      assert.equal(await retry.text(), "order 1");
      assert.equal(runs, 1);
    } finally {
      await locker.end().catch(() => {});
    }
  });
  test("a claim that Postgres writes after both the claim's and the withdrawal's calls ran out of time is withdrawn when it lands; the retry runs once (IDEM-STORE-12)", async () => {
    const store = new PostgresStore(newPool({ max: 4 }), { timeout: 400 });
    const locker = new pg.Client({ connectionString: server.url });
    locker.on("error", () => {});
    await locker.connect();
    try {
      // As above, but the other transaction holds the key past both calls' time (a paused
      // server, a maintenance lock): the claim is written after its caller got its 503.
      let released = null;
      let storageKey;
      const locking = {
        load: (key) => store.load(key),
        apply: async (key, write, now, info) => {
          if (released === null) {
            storageKey = key;
            await locker.query("BEGIN");
            await locker.query("INSERT INTO idem_records (key, version, value, deadline, expires) VALUES ($1, 'other', ''::bytea, 0, 0)", [key]);
            released = sleep(1_500).then(() => locker.query("ROLLBACK"));
          }
          return store.apply(key, write, now, info);
        },
      };
      let runs = 0;
      const handler = withIdempotency(async () => new Response(`order ${++runs}`, { status: 201 }), { store: locking, principal: "none", lease: 60_000 });
      const key = randomUUID();
      const refused = await handler(post(key));
      assert.equal(refused.status, 503);
      assert.equal(runs, 0);
      await released;
      // The claim lands now, and its withdrawal right after it.
      const until = Date.now() + 3_000;
      for (;;) {
        const { rows } = await admin.query("SELECT count(*)::int AS n FROM idem_records WHERE key = $1", [storageKey]);
        if (rows[0].n === 0) break;
        if (Date.now() > until) assert.fail("the late claim holds the key for nobody");
        await sleep(20);
      }
      const retry = await handler(post(key));
      assert.equal(retry.status, 201);
      assert.equal(await retry.text(), "order 1");
      assert.equal(runs, 1);
    } finally {
      await locker.end().catch(() => {});
    }
  });

  test("thousands of calls that gave up waiting for a connection: the connection they are handed once it frees goes back, and the process lives (IDEM-STORE-10)", async () => {
    const pool = newPool({ max: 1 });
    const store = new PostgresStore(pool, { timeout: 50 });
    const busy = await pool.connect();
    // Each call waits in the pool's queue, gives up after 50 ms, and leaves its place there.
    const calls = Array.from({ length: 5_000 }, () => store.load(randomUUID()).then(() => "loaded", (err) => err.code ?? err.message));
    const outcomes = await Promise.all(calls);
    assert.ok(outcomes.every((o) => o !== "loaded"), "a call got a connection the pool did not have");
    assert.equal(pool.waitingCount, 5_000);
    // The connection frees up, and is handed to each place in the queue in turn.
    busy.release();
    const until = Date.now() + 10_000;
    while (pool.waitingCount > 0) {
      if (Date.now() > until) assert.fail(`${pool.waitingCount} still waiting`);
      await sleep(10);
    }
    await allBack(pool);
    assert.equal(await store.load(randomUUID()), null);
  });

  test("the example orders API outlives an idle connection whose backend is terminated", async () => {
    const port = await freePort();
    const app = spawn(process.execPath, [fileURLToPath(new URL("../examples/postgres-orders/orders.mjs", import.meta.url))], {
      env: { ...process.env, DATABASE_URL: server.url, PORT: String(port) },
      stdio: ["ignore", "ignore", "pipe"],
    });
    let stderr = "";
    app.stderr.on("data", (d) => (stderr += d));
    const exited = new Promise((resolve) => app.once("exit", (code, signal) => resolve({ code, signal })));
    const order = (key) =>
      fetch(`http://127.0.0.1:${port}/orders`, {
        method: "POST",
        headers: { "content-type": "application/json", "idempotency-key": `"${key}"`, "x-customer": "c1" },
        body: JSON.stringify({ amount: 5 }),
        signal: AbortSignal.timeout(5_000),
      });
    try {
      let first;
      for (let i = 0; first === undefined; i++) {
        first = await order(randomUUID()).catch(() => undefined);
        if (first === undefined) {
          if (i > 200) assert.fail(`the example did not start: ${stderr}`);
          await sleep(25);
        }
      }
      assert.equal(first.status, 201, stderr);
      // Its pool's idle connections lose their backends.
      await admin.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND backend_type = 'client backend' AND state = 'idle'");
      const died = await Promise.race([exited, sleep(500).then(() => null)]);
      assert.equal(died, null, `the example ended: ${stderr}`);
      const next = await order(randomUUID());
      assert.equal(next.status, 201, await next.text());
    } finally {
      app.kill("SIGKILL");
      await exited;
    }
  });
});
