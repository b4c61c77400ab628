// `npm run bench:http`: requests per second of one Express 5 app over loopback HTTP, with the
// same order route mounted bare and behind each idempotency middleware, for fresh keys and
// for replays. Build first (`npm run build`).
//
// Usage: node bench/http.mjs [SECONDS] [ROUNDS]   (5-second runs, 3 rounds by default)
//
// The app (a child process, `node bench/http.mjs serve`): one Express 5.3 app, one process,
// the same route handler on every path: it parses the JSON body and answers 201 with a small
// JSON body whose `id` counts that route's runs, so that a replay (the same `id`) can be told
// from a second run.
//   POST /bare/orders                 express.json(), the route: no idempotency
//   POST /idem/orders                 idem/express over a MemoryStore, then express.json()
//                                     (a no-op there: the adapter has parsed the body), the route
//   POST /express-idempotency/orders  express.json(), express-idempotency 1.0.6 with its
//                                     in-memory adapter, the route (which returns at once when
//                                     the library has replayed, as its README asks)
// @node-idempotency has no Express integration on the npm registry
// (`@node-idempotency/express` is not published; the project ships core, storage adapters
// and a NestJS plugin), so it has no row here; its core is measured in bench.mjs and
// growing.mjs.
//
// The load (this process, apart from the app): autocannon 9, 16 keep-alive connections, one
// request at a time on each, the same nested JSON body of about 200 bytes on every request.
//   fresh   every request a new Idempotency-Key (autocannon's `setupRequest` sets it)
//   replay  a set of 1,000 keys per route, each first used once before the rounds, then
//           sent again and again in turn
// The bare route gets the same requests and runs the handler every time. The routes take
// turns, phase after phase, for ROUNDS rounds (after a 1-second warm-up of each), so a busy
// machine slows them alike; the summary shows each route's median and its ratio to the bare
// route (the median of the rounds' ratios, the two runs of a round one after the other).
// The load generator and the app share this machine's cores.
//
// Checks: before the rounds each route is sent one key twice: a guarded route must answer
// the second time with the first answer's `id` (and idem with `Idempotent-Replayed: true`,
// express-idempotency has no marker of its own). During the runs the app counts the route's
// runs: in a fresh run every 201 must be a run (and at most one more per connection, the
// requests in flight when the run stops), in a replay run a guarded route must run nothing. A route that fails a check is flagged in the output, and the exit code is 1.
import { createRequire } from "node:module";
import { serveForLoad, startApp } from "./app-process.mjs";
import { median, nestedOrder as ORDER } from "./workload.mjs";

const CONNECTIONS = 16;

const ROUTES = [
  { name: "bare (no idempotency)", id: "bare", path: "/bare/orders", guarded: false, marker: null },
  { name: "idem/express (MemoryStore)", id: "idem", path: "/idem/orders", guarded: true, marker: "idempotent-replayed" },
  { name: "express-idempotency (in-memory)", id: "express-idempotency", path: "/express-idempotency/orders", guarded: true, marker: null },
];

if (process.argv[2] === "serve") await serve();
else await load();

async function serve() {
  const { default: express } = await import("express");
  const { MemoryStore } = await import("idem");
  const { idempotency } = await import("idem/express");
  const { idempotency: expressIdempotency, getSharedIdempotencyService } = await import("express-idempotency");

  const runs = Object.fromEntries(ROUTES.map((r) => [r.id, 0]));
  const order = (id) => (req, res) => {
    runs[id]++;
    res.status(201).json({ id: `ord_${runs[id]}`, status: "created", total: req.body.total });
  };

  const app = express();
  app.post("/bare/orders", express.json(), order("bare"));

  app.use("/idem", idempotency({ store: new MemoryStore(), principal: "none" }));
  app.post("/idem/orders", express.json(), order("idem"));

  const guard = expressIdempotency();
  const service = getSharedIdempotencyService();
  const expressIdemOrder = order("express-idempotency");
  app.post("/express-idempotency/orders", express.json(), guard, (req, res) => {
    if (service.isHit(req)) return; // the library has sent the stored answer
    expressIdemOrder(req, res);
  });

  app.get("/runs", (req, res) => res.json(runs));
  serveForLoad(app);
}

async function load() {
  const SECONDS = Number(process.argv[2] ?? 5);
  const ROUNDS = Number(process.argv[3] ?? 3);
  const KEYS = 1000;
  const { default: autocannon } = await import("autocannon");

  const { app, port } = await startApp(import.meta.url);
  const base = `http://127.0.0.1:${port}`;
  const headers = { "content-type": "application/json" };
  const post = (path, key) => fetch(base + path, { method: "POST", headers: { ...headers, "idempotency-key": key }, body: ORDER });
  const runsNow = async () => (await fetch(`${base}/runs`)).json();
  let failed = false;
  const flag = (text) => {
    failed = true;
    console.log(`CHECK FAILED: ${text}`);
  };

  // Each route: one key twice. A guarded route must replay the first answer.
  console.log(`Express 5 over loopback, autocannon ${autocannonVersion()}, ${CONNECTIONS} connections, Node ${process.version}`);
  for (const route of ROUTES) {
    const key = `"probe-${route.id}"`;
    const first = await post(route.path, key);
    const a = await first.json();
    await new Promise((r) => setTimeout(r, 50)); // express-idempotency stores after sending
    const second = await post(route.path, key);
    const b = await second.json();
    const same = first.status === 201 && second.status === 201 && a.id === b.id;
    const marker = route.marker ? second.headers.get(route.marker) : null;
    if (!route.guarded) {
      if (same) flag(`${route.name} answered a second run with the first id`);
      console.log(`  ${route.name}: runs the handler again (${a.id}, then ${b.id})`);
    } else {
      if (!same) flag(`${route.name} did not replay (${first.status} ${a.id}, then ${second.status} ${b.id})`);
      if (route.marker && marker !== "true") flag(`${route.name} replay lacks ${route.marker}: true`);
      const how = route.marker ? `${route.marker}: ${marker}` : "no marker header of its own; the same body";
      console.log(`  ${route.name}: replays (${a.id}, then ${b.id}; ${how})`);
    }
  }

  // The replay set: each key used once.
  const replayKeys = {};
  for (const route of ROUTES) {
    replayKeys[route.id] = Array.from({ length: KEYS }, (_, k) => `"r-${route.id}-${k}"`);
    for (const key of replayKeys[route.id]) {
      const res = await post(route.path, key);
      await res.arrayBuffer();
      if (res.status !== 201) flag(`${route.name}: first use of a replay key answered ${res.status}`);
    }
  }
  await new Promise((r) => setTimeout(r, 100));

  let fresh = 0;
  async function run(route, phase, seconds) {
    const keys = replayKeys[route.id];
    let next = 0;
    const setupRequest = (req) => {
      const key = phase === "fresh" ? `"f-${route.id}-${fresh++}"` : keys[next++ % keys.length];
      req.headers = { ...headers, "idempotency-key": key };
      return req;
    };
    const before = (await runsNow())[route.id];
    const result = await autocannon({
      url: base,
      connections: CONNECTIONS,
      duration: seconds,
      requests: [{ method: "POST", path: route.path, headers, body: ORDER, setupRequest }],
    });
    const ran = (await runsNow())[route.id] - before;
    const ok = result["2xx"];
    const bad = result.non2xx + result.errors + result.timeouts;
    if (bad > 0) flag(`${route.name} ${phase}: ${result.non2xx} non-2xx, ${result.errors} errors, ${result.timeouts} timeouts`);
    // autocannon stops with up to one request in flight per connection, answered unseen.
    if (phase === "fresh" && (ran < ok || ran > ok + CONNECTIONS)) flag(`${route.name} fresh: ${ok} answers but ${ran} runs`);
    if (phase === "replay" && route.guarded && ran !== 0) flag(`${route.name} replay: the handler ran ${ran} times`);
    return { rps: ok / result.duration, p50: result.latency.p50, p99: result.latency.p99, ran, ok };
  }

  for (const phase of ["fresh", "replay"]) for (const route of ROUTES) await run(route, phase, 1);

  const samples = Object.fromEntries(ROUTES.map((r) => [r.id, { fresh: [], replay: [] }]));
  console.log(`\n${ROUNDS} rounds, ${SECONDS} s per route and phase`);
  for (let round = 0; round < ROUNDS; round++) {
    for (const phase of ["fresh", "replay"]) {
      for (const route of ROUTES) {
        const r = await run(route, phase, SECONDS);
        samples[route.id][phase].push(r.rps);
        console.log(
          `  round ${round + 1} ${phase.padEnd(7)}${route.name.padEnd(34)}${fmt(r.rps)} req/s   p50 ${r.p50} ms  p99 ${r.p99} ms   (${r.ok} answers, ${r.ran} runs)`,
        );
      }
    }
  }

  console.log(`\nrequests per second, median of ${ROUNDS} rounds; ratio to the bare route, median of the rounds' ratios [lowest–highest]`);
  console.log(`${"route".padEnd(36)}${"fresh".padStart(10)}${"ratio".padStart(22)}${"replay".padStart(12)}${"ratio".padStart(22)}`);
  for (const route of ROUTES) {
    const cells = ["fresh", "replay"].map((phase) => {
      const mine = samples[route.id][phase];
      const ratios = mine.map((rps, k) => rps / samples.bare[phase][k]);
      const ratio = `${median(ratios).toFixed(2)}x [${Math.min(...ratios).toFixed(2)}–${Math.max(...ratios).toFixed(2)}]`;
      return `${fmt(median(mine)).padStart(10)}${ratio.padStart(22)}`;
    });
    console.log(`${route.name.padEnd(36)}${cells[0]}  ${cells[1]}`);
  }
  if (failed) {
    console.log("\nsome checks failed (above): those rows do not measure a working route");
    process.exitCode = 1;
  }
  app.disconnect();
}

function fmt(n) {
  return Math.round(n).toLocaleString("en-US").padStart(8);
}

function autocannonVersion() {
  return createRequire(import.meta.url)("autocannon/package.json").version;
}
