// PostgresStore#transaction (IDEM-STORE-7) with the example orders API (examples/postgres-orders) on a
// private Postgres: the order row and the idempotency record commit together, a handler
// that fails commits neither, and an attempt whose lease was taken over commits nothing
// (its completion is fenced out, so its order insert rolls back with it).
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { Idempotency, idempotencyOf, withIdempotency } from "idem";
import { PostgresStore } from "idem/postgres";
import pg from "pg";
import { ORDERS_SCHEMA, ordersHandler } from "../examples/postgres-orders/orders.mjs";
import { startPostgres } from "./servers.mjs";

const post = (key, amount = 4200, customer = "cus_1") =>
  new Request("http://orders.test/orders", {
    method: "POST",
    headers: { "content-type": "application/json", "idempotency-key": `"${key}"`, "x-customer": customer },
    body: JSON.stringify({ amount }),
  });

describe("PostgresStore#transaction: the order and its idempotency record in one commit", () => {
  let server;
  let pool;
  let store;
  before(async () => {
    server = await startPostgres();
    pool = new pg.Pool({ connectionString: server.url, max: 10 });
    // pool.end() can resolve before its idle connections have closed; the server's fast
    // shutdown then terminates them, which an idle client reports as an error on the pool.
    pool.on("error", () => {});
    store = new PostgresStore(pool);
    await store.migrate();
    await pool.query(ORDERS_SCHEMA);
  });
  after(async () => {
    await pool?.end();
    await server?.stop();
  });

  const orders = async (customer) => (await pool.query("SELECT id, amount FROM orders WHERE customer = $1 ORDER BY id", [customer])).rows;

  test("a request commits its order and its record together; the retry replays without a second order", async () => {
    const handler = ordersHandler({ pool, store });
    const key = randomUUID();
    const first = await handler(post(key, 4200, "cus_a"));
    assert.equal(first.status, 201);
    const body = await first.json();
    assert.equal((await orders("cus_a")).length, 1);
    const retry = await handler(post(key, 4200, "cus_a"));
    assert.equal(retry.headers.get("idempotent-replayed"), "true");
    assert.deepEqual(await retry.json(), body);
    assert.equal((await orders("cus_a")).length, 1);
    // No transaction is left open.
    assert.equal(pool.totalCount - pool.idleCount, 0);
  });

  test("a handler that fails after its insert commits nothing, and the retry runs", async () => {
    let fail = true;
    const handler = ordersHandler({
      pool,
      store,
      work: async () => {
        if (fail) throw new Error("payment provider down");
      },
    });
    const key = randomUUID();
    await assert.rejects(handler(post(key, 100, "cus_b")), /payment provider down/);
    assert.equal((await orders("cus_b")).length, 0, "the order rolled back");
    fail = false;
    const retry = await handler(post(key, 100, "cus_b"));
    assert.equal(retry.status, 201);
    assert.equal((await orders("cus_b")).length, 1);
    assert.equal(pool.totalCount - pool.idleCount, 0);
  });

  test("a handler that answers 500 after its insert commits nothing (its answer is not kept), and the retry commits once", async () => {
    let failures = 1;
    const handler = withIdempotency(
      async (request) => {
        const { amount } = await request.json();
        return store.transaction(idempotencyOf(request), async (client) => {
          const { rows } = await client.query("INSERT INTO orders (customer, amount) VALUES ($1, $2) RETURNING id", ["cus_d", amount]);
          if (failures-- > 0) return Response.json({ error: "ledger unavailable" }, { status: 500 });
          return Response.json({ id: Number(rows[0].id) }, { status: 201 });
        });
      },
      { store, principal: (request) => request.headers.get("x-customer") },
    );
    const key = randomUUID();
    const first = await handler(post(key, 300, "cus_d"));
    assert.equal(first.status, 500);
    assert.equal((await orders("cus_d")).length, 0, "the 500's order rolled back");
    assert.equal(pool.totalCount - pool.idleCount, 0);
    const retry = await handler(post(key, 300, "cus_d"));
    assert.equal(retry.status, 201);
    assert.equal(retry.headers.get("idempotent-replayed"), null);
    const rows = await orders("cus_d");
    assert.equal(rows.length, 1);
    assert.equal(Number(rows[0].id), (await retry.json()).id);
    const again = await handler(post(key, 300, "cus_d"));
    assert.equal(again.headers.get("idempotent-replayed"), "true");
    assert.equal((await orders("cus_d")).length, 1);
    assert.equal(pool.totalCount - pool.idleCount, 0);
  });

  test("under the hold policy a 500 after the insert is held as unknown and commits nothing", async () => {
    const handler = withIdempotency(
      async (request) => {
        const { amount } = await request.json();
        return store.transaction(idempotencyOf(request), async (client) => {
          await client.query("INSERT INTO orders (customer, amount) VALUES ($1, $2)", ["cus_e", amount]);
          return Response.json({ error: "ledger unavailable" }, { status: 500 });
        });
      },
      { store, principal: (request) => request.headers.get("x-customer"), unknownOutcome: "hold" },
    );
    const key = randomUUID();
    assert.equal((await handler(post(key, 500, "cus_e"))).status, 500);
    assert.equal((await orders("cus_e")).length, 0, "the held outcome's order rolled back");
    assert.equal((await handler(post(key, 500, "cus_e"))).status, 409, "the key is held");
    assert.equal((await orders("cus_e")).length, 0);
    assert.equal(pool.totalCount - pool.idleCount, 0);
  });

  test("two attempts that both handed their transactions over: the displaced one's fenced completion rolls back only its own", async () => {
    const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
    let attempts = 0;
    const handler = withIdempotency(
      async (request) => {
        const { amount } = await request.json();
        // The first attempt stalls longest, after its transaction is handed over.
        const stall = ++attempts === 1 ? 700 : 600;
        const id = await store.transaction(idempotencyOf(request), async (client) => {
          const { rows } = await client.query("INSERT INTO orders (customer, amount) VALUES ($1, $2) RETURNING id", ["cus_f", amount]);
          return Number(rows[0].id);
        });
        await sleep(stall);
        return Response.json({ id }, { status: 201 });
      },
      { store, principal: (request) => request.headers.get("x-customer"), lease: 300 },
    );
    const key = randomUUID();
    const zombie = handler(post(key, 900, "cus_f"));
    await sleep(450);
    const takeover = await handler(post(key, 900, "cus_f"));
    assert.equal(takeover.status, 201);
    const won = await takeover.json();
    // IDEM-LEASE-5: the displaced attempt completed while the winner still ran, and says
    // so (409 in-progress), never answering with its own order, which rolled back.
    const lost = await zombie;
    assert.equal(lost.status, 409);
    assert.equal((await lost.json()).type, "urn:idem:problem:in-progress");
    const rows = await orders("cus_f");
    assert.equal(rows.length, 1, `orders: ${JSON.stringify(rows)}`);
    assert.equal(Number(rows[0].id), won.id);
    const replay = await handler(post(key, 900, "cus_f"));
    assert.deepEqual(await replay.json(), won);
    assert.equal(pool.totalCount - pool.idleCount, 0);
  });

  test("an attempt whose lease was taken over commits nothing: one order, from the attempt that completed", async () => {
    let release;
    const held = new Promise((resolve) => (release = resolve));
    let attempts = 0;
    const handler = ordersHandler({
      pool,
      store,
      lease: 300,
      work: async () => {
        attempts++;
        // The first attempt stalls past its lease (a GC pause, a slow dependency).
        if (attempts === 1) await held;
      },
    });
    const key = randomUUID();
    const zombie = handler(post(key, 700, "cus_c"));
    await new Promise((resolve) => setTimeout(resolve, 500));
    const takeover = await handler(post(key, 700, "cus_c"));
    assert.equal(takeover.status, 201);
    const won = await takeover.json();
    release();
    // IDEM-LEASE-5: the attempt that lost its lease answers with the winner's stored
    // response, never with its own (whose order rolled back).
    const lost = await zombie;
    assert.equal(lost.headers.get("idempotent-replayed"), "true");
    assert.deepEqual(await lost.json(), won);
    const rows = await orders("cus_c");
    assert.equal(rows.length, 1, `orders: ${JSON.stringify(rows)}`);
    assert.equal(Number(rows[0].id), won.id);
    const retry = await handler(post(key, 700, "cus_c"));
    assert.equal(retry.headers.get("idempotent-replayed"), "true");
    assert.deepEqual(await retry.json(), won);
    // The displaced attempt's transaction rolls back when its handler is done, after its
    // request has answered: its connection comes back then, not with the answer.
    await allBack();
  });

  /** Resolves once every connection of the pool is back, or rejects after `ms`. */
  const allBack = async (ms = 2_000) => {
    const until = Date.now() + ms;
    while (pool.totalCount - pool.idleCount !== 0) {
      if (Date.now() > until) assert.fail(`${pool.totalCount - pool.idleCount} connection(s) still out`);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  };

  test("a heartbeat committed whose answer was lost: the response is still stored with its order, never without it (IDEM-STORE-7)", async () => {
    // The store as the host sees it when the connection drops after Postgres committed the
    // heartbeat: the write happened, its answer is an error.
    const losing = {
      load: (key) => store.load(key),
      end: (key, attempt) => store.end(key, attempt),
      async apply(key, write, now, info) {
        const heartbeat = write.inFlight && write.expect !== null && info === undefined;
        const applied = await store.apply(key, write, now, info);
        if (heartbeat) throw new Error("connection terminated after the commit");
        return applied;
      },
    };
    const handler = withIdempotency(
      async (request) => {
        const { amount } = await request.json();
        const context = idempotencyOf(request);
        const id = await store.transaction(context, async (client) => {
          const { rows } = await client.query("INSERT INTO orders (customer, amount) VALUES ($1, $2) RETURNING id", ["cus_g", amount]);
          return Number(rows[0].id);
        });
        await assert.rejects(context.extend(), { code: "IDEM-STORE-4" });
        return Response.json({ id }, { status: 201 });
      },
      { store: losing, principal: (request) => request.headers.get("x-customer") },
    );
    const key = randomUUID();
    const first = await handler(post(key, 800, "cus_g"));
    assert.equal(first.status, 201);
    const body = await first.json();
    const rows = await orders("cus_g");
    assert.equal(rows.length, 1, "the response was stored without the order it describes");
    assert.equal(Number(rows[0].id), body.id);
    const retry = await handler(post(key, 800, "cus_g"));
    assert.equal(retry.headers.get("idempotent-replayed"), "true");
    assert.deepEqual(await retry.json(), body);
    await allBack();
  });

  test("a transaction handed over whose completion is refused (a status past 599) is rolled back, and the retry does not hang on its locks", async () => {
    const idem = new Idempotency({ store, principal: "none", lease: 300 });
    const run = async (status) =>
      idem.handle(
        { method: "POST", target: "/orders", key: '"refused-status"', body: new TextEncoder().encode("{}") },
        async (context) => {
          await store.transaction(context, async (client) => {
            // A row lock the next attempt needs.
            await client.query("INSERT INTO orders (id, customer, amount) VALUES (424242, 'cus_h', 1)");
          });
          return { status };
        },
      );
    await assert.rejects(run(600), { code: "IDEM-OUT-1" });
    await allBack();
    assert.equal((await orders("cus_h")).length, 0);
    await new Promise((resolve) => setTimeout(resolve, 350));
    const retry = await Promise.race([run(201), new Promise((_, reject) => setTimeout(() => reject(new Error("the retry hung")), 5_000))]);
    assert.equal(retry.status, 201);
    assert.equal((await orders("cus_h")).length, 1);
    await allBack();
  });

  test("two transactions for one request at once: the second is refused and no connection leaks", async () => {
    const idem = new Idempotency({ store, principal: "none" });
    let outcomes;
    const reply = await idem.handle(
      { method: "POST", target: "/orders", key: `"${randomUUID()}"`, body: new TextEncoder().encode("{}") },
      async (context) => {
        const insert = async (client) => {
          await new Promise((resolve) => setTimeout(resolve, 20));
          await client.query("INSERT INTO orders (customer, amount) VALUES ('cus_i', 1)");
        };
        outcomes = await Promise.allSettled([store.transaction(context, insert), store.transaction(context, insert)]);
        return { status: 201 };
      },
    );
    assert.equal(reply.status, 201);
    assert.deepEqual(
      outcomes.map((o) => o.status),
      ["fulfilled", "rejected"],
    );
    assert.equal(outcomes[1].reason.code, "IDEM-JS-1");
    assert.equal((await orders("cus_i")).length, 1);
    await allBack();
  });

  test("a transaction's connection that dies before its completion fails that completion, not the process, and commits nothing", async () => {
    const idem = new Idempotency({ store, principal: "none" });
    const reply = await idem.handle(
      { method: "POST", target: "/orders", key: `"${randomUUID()}"`, body: new TextEncoder().encode("{}") },
      async (context) => {
        const pid = await store.transaction(context, async (client) => {
          await client.query("INSERT INTO orders (customer, amount) VALUES ('cus_j', 1)");
          return (await client.query("SELECT pg_backend_pid() AS pid")).rows[0].pid;
        });
        // The server ends the connection while the store holds it (a restart, an
        // idle-in-transaction timeout): pg reports it as an error event on the client.
        const admin = new pg.Client({ connectionString: server.url });
        await admin.connect();
        await admin.query("SELECT pg_terminate_backend($1)", [pid]);
        await admin.end();
        await new Promise((resolve) => setTimeout(resolve, 300));
        return { status: 201 };
      },
    );
    assert.ok(reply.status === 201 || reply.status >= 500, `${reply.status}`);
    assert.equal((await orders("cus_j")).length, 0, "nothing committed");
    await allBack();
  });

  test("a transaction that fails at its commit answers 503, never the handler's response for work that was rolled back (IDEM-STORE-7)", async () => {
    await pool.query(`
      CREATE TABLE IF NOT EXISTS customers (id bigint PRIMARY KEY);
      CREATE TABLE IF NOT EXISTS deferred_orders (id bigserial PRIMARY KEY, customer bigint NOT NULL
        REFERENCES customers DEFERRABLE INITIALLY DEFERRED)`);
    const handler = withIdempotency(
      async (request) =>
        store.transaction(idempotencyOf(request), async (client) => {
          // A customer that does not exist: accepted now, refused at COMMIT.
          await client.query("INSERT INTO deferred_orders (customer) VALUES (42)");
          return Response.json({ order: "for customer 42" }, { status: 201 });
        }),
      { store, principal: "none" },
    );
    const answer = await handler(post(randomUUID()));
    assert.equal(answer.status, 503);
    const problem = await answer.json();
    assert.equal(problem.type, "urn:idem:problem:store-unavailable");
    assert.equal((await pool.query("SELECT count(*)::int AS n FROM deferred_orders")).rows[0].n, 0);
    await allBack();
  });

  test("a completion that lost its race and then cannot read the record: the rows roll back and the response does not go out (IDEM-STORE-7)", async () => {
    // The heartbeat is applied but its answer lost, so the completion loses its race and
    // reads the record again; that read fails too.
    let lost = false;
    const flaky = {
      load: async (key) => {
        if (lost) throw new Error("the store stopped answering");
        return store.load(key);
      },
      apply: async (key, write, now, info) => {
        const applied = await store.apply(key, write, now, info);
        if (info === undefined && write.expect !== null && !lost) {
          lost = true;
          throw new Error("the heartbeat's answer was lost");
        }
        return applied;
      },
      end: (key, attempt) => store.end(key, attempt),
    };
    const handler = withIdempotency(
      async (request) => {
        const context = idempotencyOf(request);
        return store.transaction(context, async (client) => {
          await client.query("INSERT INTO orders (customer, amount) VALUES ('cus_k', 1)");
          await assert.rejects(context.extend(), (e) => e.code === "IDEM-STORE-4");
          return Response.json({ order: "cus_k" }, { status: 201 });
        });
      },
      { store: flaky, principal: "none" },
    );
    const answer = await handler(post(randomUUID()));
    assert.equal(answer.status, 503);
    const problem = await answer.json();
    assert.equal(problem.type, "urn:idem:problem:store-unavailable");
    assert.equal(problem.requirement, "IDEM-STORE-7");
    assert.equal((await orders("cus_k")).length, 0);
    await allBack();
  });

  test("once the store is told the attempt is over, a transaction for it is refused (IDEM-STORE-7)", async () => {
    let context;
    let late;
    const telling = {
      load: (key) => store.load(key),
      apply: (key, write, now, info) => store.apply(key, write, now, info),
      end: (key, attempt) => {
        const ended = store.end(key, attempt);
        // A task the handler left behind asks for a transaction just then.
        late = store.transaction(context, async (client) => client.query("SELECT 1")).then(
          () => "opened",
          (e) => e.code,
        );
        return ended;
      },
    };
    const handler = withIdempotency(
      async (request) => {
        context = idempotencyOf(request);
        return new Response("done", { status: 201 });
      },
      { store: telling, principal: "none" },
    );
    assert.equal((await handler(post(randomUUID()))).status, 201);
    assert.equal(await late, "IDEM-LEASE-3");
    await allBack();
  });

  test("a transaction waits for a connection or for BEGIN no longer than a store call may take (IDEM-STORE-10)", async () => {
    const small = new pg.Pool({ connectionString: server.url, max: 1 });
    small.on("error", () => {});
    const bounded = new PostgresStore(small, { timeout: 300 });
    const idem = new Idempotency({ store: bounded, principal: "none" });
    let busy;
    let since;
    try {
      await assert.rejects(
        idem.handle({ method: "POST", target: "/orders", key: `"${randomUUID()}"`, body: new TextEncoder().encode("{}") }, async (context) => {
          // Once the key is claimed, the pool's one connection is busy elsewhere.
          busy = await small.connect();
          since = Date.now();
          await bounded.transaction(context, async (client) => client.query("SELECT 1"));
          return { status: 201 };
        }),
        (err) => err.code === "IDEM-STORE-4",
      );
      assert.ok(Date.now() - since < 5_000, `waited ${Date.now() - since} ms`);
    } finally {
      busy?.release();
    }
    // The connection that came too late went straight back.
    for (let i = 0; i < 200 && small.totalCount - small.idleCount !== 0; i++) await new Promise((resolve) => setTimeout(resolve, 10));
    assert.equal(small.totalCount - small.idleCount, 0);
    await small.end();
  });
});
