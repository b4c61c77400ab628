// `node bench/growing.mjs [SECONDS] [WINDOW] [idem|@node]`: idem-wasm's `Idempotency#handle`
// beside @node-idempotency/core on a store that keeps growing, for fresh keys, replays and
// mismatches, in one run. Build first (`npm run build`).
//
// Workload: one store per library that starts empty and only grows (fresh keys add a record,
// replays and mismatches add none). Every request has a JSON body of about 200 bytes with
// nested objects and arrays, built for that request; requests run one after another.
//   fresh     a new key; the handler answers 201 with a small JSON body
//   replay    a key stored earlier (spread over the whole store) with the same body
//   mismatch  a key stored earlier with a changed body; the library refuses it
// Each phase runs in windows of WINDOW seconds (default 2); within a phase the libraries take
// turns, window after window, until each has run SECONDS (default 20) in every phase. A round
// is a fresh window each, then a replay window each, then a mismatch window each, so the store
// a replay reads is the one the fresh windows before it built. Each row is one window: the
// records its library's store held, and the mean microseconds per request. The ratio per
// phase is idem's requests per second over the peer's, window by window within a round
// (the two windows ran one after the other), as the median of the rounds with the lowest and
// highest.
//
// Equal work. Each side runs as a route handler of a framework that has parsed the request
// runs: both start from the same parsed body object and end with a parsed response object.
//   idem   pays its own way in and out: `JSON.stringify` and `TextEncoder.encode` of the
//          body, `JSON.stringify` of the reply object (the engine encodes it), and on the
//          way out `TextDecoder.decode` and `JSON.parse` of the reply it returns (a fresh
//          answer, a stored one, or its problem+json refusal).
//   peer   takes objects: the parsed body goes to `onRequest` as it is (the library hashes
//          `JSON.stringify` of it itself), the handler's reply object goes to `onResponse`
//          (which stringifies the record itself), and a replay returns the stored reply as
//          an object (the library parses the record itself). A refusal is its thrown error.
//          Nothing else is added: no copy of the body or the reply that an app would not
//          make.
// Both build the same body object and the same reply object for each request, and a plain
// request record (method, target or path, key, headers).
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
const decoder = new TextDecoder();
const PHASES = ["fresh", "replay", "mismatch"];

/** About 200 bytes, nested, different for every key; `changed` alters one nested field. */
function order(i, changed) {
  return {
    customer: { id: `cus_${i % 977}`, tier: i % 3 === 0 ? "gold" : "basic" },
    items: [
      { sku: `sku_${i % 101}`, qty: (i % 4) + 1, price: 1250 + (i % 50) },
      { sku: `sku_${(i * 7) % 103}`, qty: changed ? 2 : 1, price: 399, options: { gift: i % 2 === 0, note: null } },
    ],
    currency: "eur",
    total: 1649 + (i % 50),
    metadata: { source: "web", attempt: 1, tags: ["checkout", "v2"] },
  };
}

const reply = (i) => ({ id: `ord_${i}`, status: "created" });

/** A key stored earlier: the j-th pick walks the whole store in a scattered order. */
const earlier = (j, stored) => (j * 7919) % stored;

function idemSide() {
  const idem = new Idempotency({ store: new MemoryStore({ maxEntries: 10_000_000, maxBytes: 2 ** 32 }), principal: "none" });
  let stored = 0;
  let j = 0;
  async function once(n, changed, want) {
    const body = order(n, changed);
    const answer = await idem.handle(
      {
        method: "POST",
        target: "/orders",
        key: `"g-${n}"`,
        contentType: "application/json",
        body: encoder.encode(JSON.stringify(body)),
      },
      () => ({ status: 201, headers: [["content-type", "application/json"]], body: JSON.stringify(reply(n)) }),
    );
    if (answer.status !== want) throw new Error(`idem: ${answer.status}, expected ${want}`);
    const parsed = JSON.parse(typeof answer.body === "string" ? answer.body : decoder.decode(answer.body));
    if (want === 201 && parsed.id !== `ord_${n}`) throw new Error(`idem: answer ${parsed.id} for key ${n}`);
  }
  return {
    name: "idem Idempotency#handle",
    records: () => stored,
    fresh: () => once(stored++, false, 201),
    replay: () => once(earlier(j++, stored), false, 201),
    mismatch: () => once(earlier(j++, stored), true, 422),
  };
}

function peerSide() {
  const idem = new NodeIdempotency(new MemoryStorageAdapter(), { enforceIdempotency: true });
  let stored = 0;
  let j = 0;
  async function once(n, changed, want) {
    const req = {
      headers: { "idempotency-key": `g-${n}`, "content-type": "application/json" },
      path: "/orders",
      method: "POST",
      body: order(n, changed),
    };
    let status;
    let answer;
    try {
      const cached = await idem.onRequest(req);
      if (cached) {
        status = cached.additional.status;
        answer = cached.body;
      } else {
        const res = { body: reply(n), additional: { status: 201 } };
        await idem.onResponse(req, res);
        status = 201;
        answer = res.body;
      }
    } catch (err) {
      if (err.code !== "IDEMPOTENCY_FINGERPRINT_MISSMATCH") throw err;
      status = 422;
    }
    if (status !== want) throw new Error(`node-idempotency: ${status}, expected ${want}`);
    if (want === 201 && answer.id !== `ord_${n}`) throw new Error(`node-idempotency: answer ${answer.id} for key ${n}`);
  }
  return {
    name: "@node-idempotency/core",
    records: () => stored,
    fresh: () => once(stored++, false, 201),
    replay: () => once(earlier(j++, stored), false, 201),
    mismatch: () => once(earlier(j++, stored), true, 422),
  };
}

async function window(side, phase) {
  const start = process.hrtime.bigint();
  const deadline = start + BigInt(Math.round(WINDOW * 1e9));
  const run = side[phase];
  let n = 0;
  let now = start;
  while (now < deadline) {
    for (let k = 0; k < 64; k++) await run();
    n += 64;
    now = process.hrtime.bigint();
  }
  return { seconds: Number(now - start) / 1e9, n };
}

const sides = [idemSide(), peerSide()].filter((s) => !ONLY || s.name.startsWith(ONLY));
const spent = new Map(sides.map((s) => [s, 0]));
const rows = [];
for (let round = 0; sides.some((s) => spent.get(s) < SECONDS); round++) {
  for (const phase of PHASES) {
    for (const side of sides) {
      const { seconds, n } = await window(side, phase);
      if (phase === "fresh") spent.set(side, spent.get(side) + seconds);
      const mem = process.memoryUsage();
      rows.push({ round, phase, side: side.name, records: side.records(), us: (seconds * 1e6) / n, heap: mem.heapUsed, rss: mem.rss });
    }
  }
}

console.log(`nested ~200-byte bodies built per request, one growing store per library, ${WINDOW} s windows, Node ${process.version}`);
for (const phase of PHASES) {
  console.log(`\n${phase}`);
  console.log("library                         records at end   µs per request");
  for (const r of rows.filter((r) => r.phase === phase)) {
    console.log(
      `${r.side.padEnd(32)}${String(r.records).padStart(15)}   ${r.us.toFixed(1).padStart(14)}   heap ${(r.heap / 1e6).toFixed(0)} MB rss ${(r.rss / 1e6).toFixed(0)} MB`,
    );
  }
}

if (sides.length === 2) {
  const median = (xs) => {
    const s = [...xs].sort((a, b) => a - b);
    return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
  };
  console.log(`\nratio ${sides[0].name} / ${sides[1].name}, requests per second (above 1.00 = idem faster),`);
  console.log("median of the rounds [lowest–highest]");
  for (const phase of PHASES) {
    const ratios = [];
    for (const r of rows.filter((r) => r.phase === phase && r.side === sides[0].name)) {
      const peer = rows.find((p) => p.phase === phase && p.round === r.round && p.side === sides[1].name);
      ratios.push(peer.us / r.us);
    }
    const mine = rows.filter((r) => r.phase === phase && r.side === sides[0].name).map((r) => r.us);
    const theirs = rows.filter((r) => r.phase === phase && r.side === sides[1].name).map((r) => r.us);
    console.log(
      `  ${phase.padEnd(10)}${median(ratios).toFixed(2)}x [${Math.min(...ratios).toFixed(2)}–${Math.max(...ratios).toFixed(2)}]` +
        `   idem ${median(mine).toFixed(1)} µs, peer ${median(theirs).toFixed(1)} µs (medians)`,
    );
  }
}
