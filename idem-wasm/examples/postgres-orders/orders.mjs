// An orders API on Postgres where the order row and the idempotency record commit in one
// transaction: the completion write and the order insert are one commit, so a request's
// effect and its stored answer exist together or not at all. A retry after a lost response
// replays the answer; an attempt that lost its lease (another took over) commits nothing.
//
//   DATABASE_URL=postgres://… PORT=8080 node orders.mjs
import { createServer } from "node:http";
import { idempotencyOf, withIdempotency } from "idem";
import { PostgresStore } from "idem/postgres";
import pg from "pg";

/** The application's own table. */
export const ORDERS_SCHEMA = `
CREATE TABLE IF NOT EXISTS orders (
  id         bigserial PRIMARY KEY,
  customer   text   NOT NULL,
  amount     bigint NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);`;

/** The Fetch handler: POST /orders with `{ amount }`, the customer from X-Customer.
 * `work(order)` runs inside the transaction after the insert (the tests use it to slow an
 * attempt down or make it fail). */
export function ordersHandler({ pool, store = new PostgresStore(pool), work = async () => {}, ...options }) {
  return withIdempotency(
    async (request) => {
      const { amount } = await request.json();
      if (!Number.isSafeInteger(amount) || amount <= 0) {
        return Response.json({ type: "urn:example:invalid-order", title: "amount must be a positive integer", status: 400 }, { status: 400 });
      }
      const customer = request.headers.get("x-customer");
      // The insert and the completion commit together (PostgresStore#transaction).
      return store.transaction(idempotencyOf(request), async (client) => {
        const { rows } = await client.query("INSERT INTO orders (customer, amount) VALUES ($1, $2) RETURNING id", [customer, amount]);
        await work(rows[0]);
        return Response.json({ id: Number(rows[0].id), customer, amount }, { status: 201 });
      });
    },
    { store, principal: (request) => request.headers.get("x-customer") ?? "", ...options },
  );
}

async function main() {
  const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
  // An idle connection that loses its server (a restart, a terminated backend) reports here;
  // without a listener, pg's error would end the process. The pool makes a new one.
  pool.on("error", (err) => console.error("postgres:", err.message));
  const store = new PostgresStore(pool);
  await store.migrate();
  await pool.query(ORDERS_SCHEMA);
  const handler = ordersHandler({ pool, store });
  // Expired records are swept once a minute (the engine reads expiry from each record
  // anyway; the sweep only frees the space).
  setInterval(() => store.sweep().catch((err) => console.error("sweep:", err.message)), 60_000).unref();
  createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const headers = new Headers();
    for (let i = 0; i < req.rawHeaders.length; i += 2) headers.append(req.rawHeaders[i], req.rawHeaders[i + 1]);
    const hasBody = req.method !== "GET" && req.method !== "HEAD";
    const response = await handler(new Request(`http://localhost${req.url}`, { method: req.method, headers, body: hasBody ? Buffer.concat(chunks) : undefined }));
    res.writeHead(response.status, [...response.headers].flat());
    res.end(Buffer.from(await response.arrayBuffer()));
  }).listen(Number(process.env.PORT ?? 8080), "127.0.0.1");
}

if (import.meta.url === `file://${process.argv[1]}`) await main();
