// `npm run bench`: the cost of withIdempotency at the edge. One local workerd (Miniflare,
// 127.0.0.1, Durable Object state in a temporary directory) serves the same order handler,
// in the orders object, on two routes: POST /orders with withIdempotency over the object's
// own storage, and POST /unprotected/orders without it (the same run count and order write).
// autocannon drives them in one run: the unprotected route, the protected route with a fresh
// key per request (claim, handler, completion with the order), and the protected route
// replaying completed keys. POST /unprotected/runs, the handler in the worker counting its
// run and writing no order, is the floor: one round trip and one write. A second workerd serves
// POST /orders with its claims written (ORDER_WRITES_ONLY = "off"), for a fresh-key row of
// its own. The phases alternate in rounds, so that a change in the machine's load touches
// all of them alike; each row adds up
// its rounds (requests per second over the time spent in them, percentiles over every
// response's latency). A phase's time runs from its start to its last response, measured
// here: autocannon's own finish time is its next one-second sample tick, which would round
// every phase up to whole seconds. Bounded: a fixed number of requests, and each phase stops
// after a time limit. On Linux each row also gives the workerd process's CPU time per
// request (user and system, from /proc): the machine's other work moves it far less than it
// moves requests per second, which a busy disk or CPU can hold down for every route alike.
//
//   npm run bench -- [--requests N] [--rounds R] [--connections C] [--storage disk|memory]
import autocannon from "autocannon";
import { randomUUID } from "node:crypto";
import { cpus, loadavg } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { existsSync, readFileSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import { removeDir, startWorker, tempDir } from "../test/runtime.mjs";

const MINIFLARE_VERSION = JSON.parse(readFileSync(createRequire(import.meta.url).resolve("miniflare/package.json"), "utf8")).version;

const { values } = parseArgs({
  options: {
    requests: { type: "string", default: "6000" },
    rounds: { type: "string", default: "6" },
    connections: { type: "string", default: "8" },
    "phase-seconds": { type: "string", default: "30" },
    storage: { type: "string", default: "disk" },
  },
});
const REQUESTS = Number(values.requests);
const ROUNDS = Number(values.rounds);
const CONNECTIONS = Number(values.connections);
const PHASE_LIMIT_MS = Number(values["phase-seconds"]) * 1000;
const BODY = '{"amount":4200,"currency":"eur","description":"bench"}';
const HEADERS = { "content-type": "application/json", authorization: "Bearer bench" };

/** A row's totals over its rounds. */
function tally(name) {
  return { name, ok: 0, other: 0, ms: 0, cpuMs: 0, latencies: [] };
}

/** The child processes of this one (each worker's workerd), where `ps` can list them. */
function children() {
  try {
    return execFileSync("ps", ["-o", "pid=", "--ppid", String(process.pid)], { encoding: "utf8" }).trim().split(/\s+/).filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/** The CPU time (user and system) of process `pid` so far, in ms; 0 without /proc. */
function cpuMs(pid) {
  if (pid === undefined || !existsSync(`/proc/${pid}/stat`)) return 0;
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ");
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100;
}

/** One autocannon phase of `amount` requests into `row`, stopped after PHASE_LIMIT_MS at the
 * latest. */
function phase(row, url, amount, setupRequest, pid) {
  return new Promise((resolve, reject) => {
    const cpuStart = cpuMs(pid);
    const start = performance.now();
    let last = start;
    const instance = autocannon(
      {
        url,
        method: "POST",
        headers: HEADERS,
        body: BODY,
        connections: CONNECTIONS,
        amount,
        timeout: 10,
        requests: setupRequest ? [{ setupRequest }] : undefined,
      },
      (err, result) => {
        clearTimeout(timer);
        if (err) return reject(err);
        if (row !== null) {
          row.ok += result["2xx"];
          row.other += result.non2xx + result.errors + result.timeouts;
          row.ms += last - start;
          row.cpuMs += cpuMs(pid) - cpuStart;
        }
        resolve();
      },
    );
    if (row !== null) {
      instance.on("response", (_client, _status, _bytes, ms) => {
        last = performance.now();
        row.latencies.push(ms);
      });
    }
    const timer = setTimeout(() => instance.stop(), PHASE_LIMIT_MS);
  });
}

const withKey = (key) => (req) => ({ ...req, headers: { ...req.headers, "idempotency-key": key } });
const freshKey = (req) => withKey(`"${randomUUID()}"`)(req);

function percentile(sorted, p) {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

function summary(row) {
  const sorted = Float64Array.from(row.latencies).sort();
  return { ...row, rps: row.ok / (row.ms / 1000), p50: percentile(sorted, 50), p99: percentile(sorted, 99) };
}

const dir = tempDir("idem-worker-bench-");
const onDisk = values.storage !== "memory";
const workers = [];
try {
  for (const [name, writesOnly] of [
    ["held", "on"],
    ["written", "off"],
  ]) {
    const persist = onDisk ? join(dir, name) : undefined;
    const before = new Set(children());
    const started = await startWorker({ persist, vars: { UNPROTECTED_ROUTE: "on", ORDER_WRITES_ONLY: writesOnly } });
    started.pid = children().find((pid) => !before.has(pid));
    workers.push(started);
  }
  const [worker, written] = workers;
  const protectedUrl = `${worker.url}/orders`;
  const writtenUrl = `${written.url}/orders`;
  const unprotectedUrl = `${worker.url}/unprotected/orders`;
  const floorUrl = `${worker.url}/unprotected/runs`;
  // Warm-up: every route, fresh keys, not reported.
  await phase(null, floorUrl, 500);
  await phase(null, unprotectedUrl, 500);
  await phase(null, protectedUrl, 500, freshKey);
  await phase(null, writtenUrl, 500, freshKey);
  // The keys the replay phase repeats, completed first.
  const replayKeys = Array.from({ length: CONNECTIONS * 4 }, () => `"${randomUUID()}"`);
  for (const key of replayKeys) {
    const r = await fetch(protectedUrl, { method: "POST", headers: { ...HEADERS, "idempotency-key": key }, body: BODY });
    if (r.status !== 201) throw new Error(`setting up replays: ${r.status} ${await r.text()}`);
    await r.arrayBuffer();
  }
  let next = 0;
  const replayKey = (req) => withKey(replayKeys[next++ % replayKeys.length])(req);

  const loadBefore = loadavg()[0];
  const started = Date.now();
  const plain = tally("without withIdempotency (POST /unprotected/orders)");
  const floor = tally("floor: a run counted, no order (POST /unprotected/runs)");
  const fresh = tally("withIdempotency, fresh keys (POST /orders, claims held: writesOnly)");
  const freshWritten = tally("withIdempotency, fresh keys (POST /orders, claims written)");
  const replays = tally("withIdempotency, replays (POST /orders)");
  const perRound = Math.ceil(REQUESTS / ROUNDS);
  for (let round = 0; round < ROUNDS; round++) {
    await phase(plain, unprotectedUrl, perRound, undefined, worker.pid);
    await phase(floor, floorUrl, perRound, undefined, worker.pid);
    await phase(fresh, protectedUrl, perRound, freshKey, worker.pid);
    await phase(freshWritten, writtenUrl, perRound, freshKey, written.pid);
    await phase(replays, protectedUrl, perRound, replayKey, worker.pid);
  }
  const rows = [plain, fresh, freshWritten, replays, floor].map(summary);
  const [base] = rows;
  console.log(
    `\nworkerd (Miniflare ${MINIFLARE_VERSION}), Node ${process.versions.node}, ${cpus().length} cores, 127.0.0.1, ` +
      `${CONNECTIONS} keep-alive connections, ${perRound * ROUNDS} requests per route in ${ROUNDS} alternating rounds, ` +
      `Durable Object state ${onDisk ? "on disk" : "in memory"}; ${((Date.now() - started) / 1000).toFixed(1)} s, ` +
      `load average ${loadBefore.toFixed(2)} before, ${loadavg()[0].toFixed(2)} after\n`,
  );
  console.log("| route | req/s | p50 ms | p99 ms | req/s ratio to unprotected | workerd CPU µs/req | CPU ratio | requests | non-2xx/errors |");
  console.log("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
  const cpuPerRequest = (r) => (r.cpuMs * 1000) / Math.max(1, r.ok + r.other);
  for (const r of rows) {
    // The CPU ratio is unprotected ÷ this route, as the req/s ratio is this route ÷ unprotected.
    const cpu = r.cpuMs > 0 ? [Math.round(cpuPerRequest(r)).toLocaleString("en-US"), (cpuPerRequest(base) / cpuPerRequest(r)).toFixed(2)] : ["–", "–"];
    console.log(
      `| ${r.name} | ${Math.round(r.rps).toLocaleString("en-US")} | ${r.p50.toFixed(2)} | ${r.p99.toFixed(2)} | ${(r.rps / base.rps).toFixed(2)} | ${cpu[0]} | ${cpu[1]} | ${r.ok + r.other} | ${r.other} |`,
    );
  }
  if (rows.some((r) => r.other > 0)) {
    console.error("\nsome requests did not succeed: the numbers above are not comparable");
    process.exitCode = 1;
  }
} finally {
  for (const w of workers) await w.dispose();
  removeDir(dir);
}
