// `node bench/inside.mjs [orders] [rounds]`: the cost of an order inside the orders object,
// without HTTP. One local workerd (Miniflare, Durable Object state on disk in a temporary
// directory) runs bench/inside-worker.js; each round asks the object to serve `orders` fresh
// orders (default 3,000) to itself, one after another, on the unprotected route, on the
// protected one and on two floors between them (see inside-worker.js: what a Fetch wrapper
// must do, and withIdempotency over a MemoryStore), and times the whole request from here.
// The first round warms up and is not printed. Build the package first (`npm run build` in
// idem-wasm).
import { removeDir, startWorker, tempDir } from "../test/runtime.mjs";

const ORDERS = Number(process.argv[2] ?? 3000);
const ROUNDS = Number(process.argv[3] ?? 3);
const ROUTES = ["/unprotected/orders", "floor:fetch", "floor:memory", "/orders"];

const dir = tempDir();
const worker = await startWorker({ entry: "bench/inside-worker.js", persist: dir, vars: { UNPROTECTED_ROUTE: "on" } });
try {
  const namespace = await worker.mf.getDurableObjectNamespace("LEDGER");
  const ledger = namespace.get(namespace.idFromName("orders"));
  console.log(`µs per order inside the orders object, ${ORDERS} fresh orders per route and round`);
  for (let round = 0; round < ROUNDS; round++) {
    const row = [];
    for (const route of ROUTES) {
      const start = performance.now();
      const response = await ledger.fetch(`http://orders.local/__inside?route=${encodeURIComponent(route)}&n=${ORDERS}`);
      const text = await response.text();
      if (response.status !== 200) throw new Error(text);
      row.push(`${route} ${(((performance.now() - start) * 1000) / ORDERS).toFixed(0)}`);
    }
    if (round > 0) console.log(`round ${round}: ${row.join(", ")}`);
  }
} finally {
  await worker.dispose();
  removeDir(dir);
}
