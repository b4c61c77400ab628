// `npm run bench:fetch`: what `withIdempotency` costs on top of a Fetch handler, in the
// runtime that runs this file. The same file runs under all three (build first, `npm run
// build`; the commands are run from idem-wasm/):
//
//   node bench/fetch.mjs [N] [R] [--content-length] [--against DIST]
//   bun bench/fetch.mjs [N] [R] [--content-length] [--against DIST]          (node_modules/.bin/bun)
//   deno run -A bench/fetch.mjs [N] [R] [--content-length] [--against DIST]  (test/deno/node_modules/@deno/linux-x64-glibc/deno)
//
// Each row serves N requests with fresh keys, then the same N keys again (replays), one after
// another (no overlap), so that the figures are per-request costs. The rows take turns in R
// rounds (defaults: 2,000 requests, 9 rounds), the first row of a round moving one place each
// round, so that a busy machine slows them alike; each figure is the median of the rounds,
// and each difference the median of the rounds' own differences.
//
// Equal work. Every Fetch row starts from the same body object (about 90 bytes of JSON, built
// for each request): the caller builds a `Request` with `JSON.stringify` of it and an
// `Idempotency-Key`, and ends with `response.json()` of the answer. The handler reads
// `request.json()` and answers `Response.json({...}, { status: 201 })`.
//   (a) the handler alone, no idempotency (a "replay" runs the handler again);
//   (b) the handler wrapped in `withIdempotency` over a `MemoryStore`;
//   (c) the floor: the Fetch work any Fetch-standard idempotency wrapper must do, with no
//       idempotency at all. With the handler (fresh): read the request body before the
//       handler and give the handler a readable Request, read the response body to keep it
//       and return a fresh Response. Without it (replay): read the body and build a Response
//       from stored bytes. The "Fetch plumbing" rows of bench/bench.mjs.
//   (d) `Idempotency#handle` on the same data, for reference: it starts from the same body
//       object (`JSON.stringify` and `TextEncoder.encode` of it) and ends with `JSON.parse`
//       of its decoded reply.
// A `Request` built in the process has no `Content-Length`, so `withIdempotency` reads its body
// chunk by chunk, to refuse an endless upload as soon as it passes the limit. A server's
// `Request` carries the length its client declared, and a body of a declared length is read
// at once: `--content-length` gives every row's `Request` that header, as a server's has.
// `--against DIST` adds (b) from another build of the package (a `dist` directory, for
// example a copy of the one before a change), in the same rounds.
import { answer, answered, bodyOf, median, orderHandler, plumbing } from "./workload.mjs";

const runtime = globalThis.Deno
  ? `Deno ${Deno.version.deno}`
  : globalThis.Bun
    ? `Bun ${Bun.version}`
    : `Node ${process.version}`;
const args = globalThis.Deno ? Deno.args : process.argv.slice(2);
const flag = args.indexOf("--against");
const against = flag < 0 ? null : args[flag + 1];
const declared = args.includes("--content-length");
const numbers = args.filter((a, k) => !a.startsWith("--") && (flag < 0 || k !== flag + 1));
const N = Number(numbers[0] ?? 2000);
const ROUNDS = Number(numbers[1] ?? 9);

const idem = await import("idem");
/** The entry the package's exports map gives this runtime, in another build. */
async function build(dir) {
  const entry = globalThis.Deno ? "deno.js" : globalThis.Bun ? "bun.js" : "node.js";
  const base = new URL(dir.endsWith("/") ? dir : `${dir}/`, `file://${globalThis.Deno ? Deno.cwd() : process.cwd()}/`);
  return import(new URL(entry, base).href);
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

function request(prefix, i) {
  const body = JSON.stringify(bodyOf(i));
  const headers = { "idempotency-key": `"${prefix}-${i}"`, "content-type": "application/json" };
  // The bodies are ASCII: their length in bytes is their length in characters.
  if (declared) headers["content-length"] = String(body.length);
  return new Request("http://api.local/orders", { method: "POST", headers, body });
}

/** A Fetch row: `make()` gives the handler the caller sends each request to. `check` says
 * whether the answer must be the one stored for its key (the rows without idempotency answer
 * a replay with a fixed reply). */
function fetchRow(make, check) {
  let handler = null;
  return {
    setup() {
      handler = make();
    },
    async run(prefix, i) {
      const response = await handler(request(prefix, i));
      const body = await response.json();
      if (response.status !== 201 || (check && body.id !== `ord_${i}`)) throw new Error(`${response.status} ${body.id} for ${i}`);
    },
  };
}

const idemRow = (pkg) => fetchRow(() => pkg.withIdempotency(orderHandler, { store: new pkg.MemoryStore(), principal: "none" }), true);

/** (c): the plumbing for a fresh key, the stored-bytes answer for a replay (the phase picks
 * one: the floor looks nothing up). */
function floorRow() {
  const fresh = plumbing();
  const replay = answered();
  return {
    setup() {},
    async run(prefix, i, phase) {
      const response = await (phase === "fresh" ? fresh : replay)(request(prefix, i));
      const body = await response.json();
      if (response.status !== 201 || body.status !== "created") throw new Error(`${response.status} for ${i}`);
    },
  };
}

function plainRow() {
  let handle = null;
  return {
    setup() {
      handle = new idem.Idempotency({ store: new idem.MemoryStore(), principal: "none" });
    },
    async run(prefix, i) {
      const reply = await handle.handle(
        {
          method: "POST",
          target: "/orders",
          key: `"${prefix}-${i}"`,
          contentType: "application/json",
          body: encoder.encode(JSON.stringify(bodyOf(i))),
        },
        () => ({ status: 201, headers: [["content-type", "application/json"]], body: JSON.stringify(answer(i)) }),
      );
      const body = JSON.parse(typeof reply.body === "string" ? reply.body : decoder.decode(reply.body));
      if (reply.status !== 201 || body.id !== `ord_${i}`) throw new Error(`${reply.status} ${body.id} for ${i}`);
    },
  };
}

const rows = [
  ["(a) the handler alone", fetchRow(() => orderHandler, false)],
  ["(b) withIdempotency", idemRow(idem)],
  ["(c) the floor: the Fetch work any wrapper must do", floorRow()],
  ["(d) Idempotency#handle, same data", plainRow()],
];
if (against !== null) rows.splice(2, 0, [`(b) withIdempotency, ${against}`, idemRow(await build(against))]);
const phases = ["fresh", "replay"];

/** µs per request for each phase, on a store of its own. */
async function measure(row, prefix, n) {
  row.setup();
  const out = {};
  for (const phase of phases) {
    const start = performance.now();
    for (let i = 0; i < n; i++) await row.run(prefix, i, phase);
    out[phase] = ((performance.now() - start) * 1000) / n;
  }
  return out;
}

// Warm up every path on keys of its own.
for (const [, row] of rows) await measure(row, "warm", N);

const samples = rows.map(() => []);
for (let round = 0; round < ROUNDS; round++) {
  for (let k = 0; k < rows.length; k++) {
    const which = (round + k) % rows.length;
    samples[which].push(await measure(rows[which][1], `run${round}`, N));
  }
}
const col = (x) => x.toFixed(1).padStart(10);
const line = (label, f) => console.log(`  ${label.padEnd(58)}${phases.map((p) => col(f(p))).join("")}`);
const form = declared ? "with Content-Length" : "without Content-Length";
console.log(`\nµs per request, ${runtime}, median of ${ROUNDS} rounds of ${N} requests per phase, requests ${form}\n`);
console.log(`  ${"".padEnd(58)}${phases.map((p) => p.padStart(10)).join("")}`);
rows.forEach(([label], k) => line(label, (p) => median(samples[k].map((s) => s[p]))));
/** The median of the rounds' differences between two rows. */
const diff = (b, a) => (p) => median(samples[b].map((s, r) => s[p] - samples[a][r][p]));
const at = (label) => rows.findIndex(([l]) => l === label);
const [A, B, C, D] = ["(a) the handler alone", "(b) withIdempotency", "(c) the floor: the Fetch work any wrapper must do", "(d) Idempotency#handle, same data"].map(at);
console.log("");
line("added = (b) − (a)", diff(B, A));
line("idem's own = (b) − (c)", diff(B, C));
line("the floor's own = (c) − (a)", diff(C, A));
// What the wrapper adds beyond the engine's own work, which (d) does with plain objects.
line("the wrapper beyond the engine = (b) − (c) − (d)", (p) => median(samples[B].map((s, r) => s[p] - samples[C][r][p] - samples[D][r][p])));
if (against !== null) {
  const O = at(`(b) withIdempotency, ${against}`);
  line(`added with ${against}`, diff(O, A));
  line(`idem's own with ${against}`, diff(O, C));
  line(`(b) − (b) with ${against}`, diff(B, O));
}
