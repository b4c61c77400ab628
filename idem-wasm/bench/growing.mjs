// `node bench/growing.mjs [SECONDS] [WINDOW]`: the cost of a fresh request as the store
// grows, for idem-wasm's `Idempotency#handle` beside @node-idempotency/core, in one run.
// Build first (`npm run build`).
//
// Workload (both libraries, same data): one store per library that starts empty and only
// grows; every request has a fresh key and a new JSON body of about 200 bytes with nested
// objects and arrays, built for that request; the handler answers 201 with a small JSON body,
// and the caller parses the answer back into an object. Requests run one after another.
// The libraries take turns in windows of WINDOW seconds (default 2) until each has run for
// SECONDS (default 20); each row is one window: the records its store held at the end, and
// the mean microseconds per request in that window.
//
// For a CPU profile of the idem-wasm side alone:
//   node --cpu-prof --cpu-prof-dir=/tmp/prof bench/growing.mjs 10 2 idem
import { Idempotency, MemoryStore } from "idem";
import { Idempotency as NodeIdempotency } from "@node-idempotency/core";
import { MemoryStorageAdapter } from "@node-idempotency/storage-adapter-memory";

const SECONDS = Number(process.argv[2] ?? 20);
const WINDOW = Number(process.argv[3] ?? 2);
const ONLY = process.argv[4];
const encoder = new TextEncoder();

/** About 200 bytes, nested, different for every request. */
function order(i) {
  return {
    customer: { id: `cus_${i % 977}`, tier: i % 3 === 0 ? "gold" : "basic" },
    items: [
      { sku: `sku_${i % 101}`, qty: (i % 4) + 1, price: 1250 + (i % 50) },
      { sku: `sku_${(i * 7) % 103}`, qty: 1, price: 399, options: { gift: i % 2 === 0, note: null } },
    ],
    currency: "eur",
    total: 1649 + (i % 50),
    metadata: { source: "web", attempt: 1, tags: ["checkout", "v2"] },
  };
}

const reply = (i) => JSON.stringify({ id: `ord_${i}`, status: "created" });

function idemSide() {
  const idem = new Idempotency({ store: new MemoryStore({ maxEntries: 10_000_000, maxBytes: 2 ** 32 }), principal: "none" });
  let i = 0;
  return {
    name: "idem-wasm Idempotency#handle",
    records: () => i,
    async once() {
      const n = i++;
      const answer = await idem.handle(
        {
          method: "POST",
          target: "/orders",
          key: `"g-${n}"`,
          contentType: "application/json",
          body: encoder.encode(JSON.stringify(order(n))),
        },
        () => ({ status: 201, headers: [["content-type", "application/json"]], body: reply(n) }),
      );
      if (answer.status !== 201) throw new Error(`idem: ${answer.status}`);
      JSON.parse(typeof answer.body === "string" ? answer.body : new TextDecoder().decode(answer.body));
    },
  };
}

function peerSide() {
  const idem = new NodeIdempotency(new MemoryStorageAdapter(), { enforceIdempotency: true });
  let i = 0;
  return {
    name: "@node-idempotency/core",
    records: () => i,
    async once() {
      const n = i++;
      const req = {
        headers: { "idempotency-key": `g-${n}`, "content-type": "application/json" },
        path: "/orders",
        method: "POST",
        body: JSON.parse(JSON.stringify(order(n))),
      };
      const cached = await idem.onRequest(req);
      if (cached) throw new Error("node-idempotency: a fresh key replayed");
      const res = { body: JSON.parse(reply(n)), additional: { status: 201 } };
      await idem.onResponse(req, res);
      JSON.parse(JSON.stringify(res.body));
    },
  };
}

const sides = [idemSide(), peerSide()].filter((s) => !ONLY || s.name.startsWith(ONLY));
const spent = new Map(sides.map((s) => [s, 0]));
const rows = [];
while (sides.some((s) => spent.get(s) < SECONDS)) {
  for (const side of sides) {
    if (spent.get(side) >= SECONDS) continue;
    const start = process.hrtime.bigint();
    const deadline = start + BigInt(Math.round(WINDOW * 1e9));
    let n = 0;
    let now = start;
    while (now < deadline) {
      for (let k = 0; k < 64; k++) await side.once();
      n += 64;
      now = process.hrtime.bigint();
    }
    const seconds = Number(now - start) / 1e9;
    spent.set(side, spent.get(side) + seconds);
    rows.push({ side: side.name, records: side.records(), us: (seconds * 1e6) / n, heap: process.memoryUsage().heapUsed, rss: process.memoryUsage().rss });
  }
}
console.log(`fresh requests, nested ~200-byte bodies, one growing store per library, ${WINDOW} s windows`);
console.log("library                         records at end   µs per request");
for (const r of rows) {
  console.log(`${r.side.padEnd(32)}${String(r.records).padStart(15)}   ${r.us.toFixed(1).padStart(14)}   heap ${(r.heap / 1e6).toFixed(0)} MB rss ${(r.rss / 1e6).toFixed(0)} MB`);
}
