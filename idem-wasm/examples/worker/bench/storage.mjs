// `node bench/storage.mjs [requests] [rounds]`: what a SQLite-backed Durable Object's storage
// operations cost under workerd by themselves, as the workerd process's CPU time per request
// (read from /proc, so Linux only; CPU time, unlike requests per second, hardly moves with
// what else the machine runs). One local workerd (Miniflare, state on disk in a temporary
// directory) runs bench/storage-worker.js; autocannon (8 connections) drives each operation
// in turn, `requests` requests (default 2,000) per operation and round, rounds alternating
// (default 4). Each request reads its body, counts itself with one put, and does its
// operation ten times: an operation's cost is its row less the row of `none`, over ten.
// `record-and-index` is what a record costs through the key-value API (its row and its
// deadline index's row); `record-row-sql` the same record as one row of a SQL table with its
// deadline in an indexed column.
import autocannon from "autocannon";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { execFileSync } from "node:child_process";
import { removeDir, tempDir } from "../test/runtime.mjs";

const { Miniflare } = await import("miniflare");
const REQUESTS = Number(process.argv[2] ?? 2000);
const ROUNDS = Number(process.argv[3] ?? 4);
const OPERATIONS = [
  "none",
  "read-missing-kv",
  "read-missing",
  "record-at-random",
  "bytes-at-random",
  "small-at-random",
  "small-appended",
  "record-and-index",
  "record-row-sql",
];
const TIMES = 10;

/** The child processes of this one (workerd is Miniflare's). */
const children = () =>
  execFileSync("ps", ["-o", "pid=", "--ppid", String(process.pid)], { encoding: "utf8" }).trim().split(/\s+/).filter(Boolean).map(Number);

/** The CPU time (user and system) of a process so far, in ms. */
function cpuMs(pid) {
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ");
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100;
}

function drive(url, amount) {
  return new Promise((resolve, reject) => {
    autocannon({ url, method: "POST", body: '{"amount":4200,"currency":"eur"}', connections: 8, amount }, (err, result) => {
      if (err) return reject(err);
      if (result.non2xx + result.errors + result.timeouts > 0) return reject(new Error(`${url}: requests failed`));
      resolve();
    });
  });
}

const dir = tempDir("idem-storage-bench-");
const before = new Set(children());
const mf = new Miniflare({
  modules: true,
  scriptPath: fileURLToPath(new URL("storage-worker.js", import.meta.url)),
  compatibilityDate: "2026-04-01",
  durableObjects: { STORAGE: { className: "Storage", useSQLite: true } },
  durableObjectsPersist: dir,
  host: "127.0.0.1",
  port: 0,
  cf: false,
});
try {
  const url = (await mf.ready).toString().replace(/\/$/, "");
  const pid = children().find((p) => !before.has(p));
  for (const op of OPERATIONS) await drive(`${url}/${op}`, 300);
  const totals = Object.fromEntries(OPERATIONS.map((op) => [op, []]));
  for (let round = 0; round < ROUNDS; round++) {
    for (const op of round % 2 === 0 ? OPERATIONS : [...OPERATIONS].reverse()) {
      const start = cpuMs(pid);
      await drive(`${url}/${op}`, REQUESTS);
      totals[op].push(((cpuMs(pid) - start) * 1000) / REQUESTS);
    }
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const base = median(totals.none);
  console.log(`workerd CPU µs per request (${REQUESTS} requests × ${ROUNDS} rounds); per operation: (median − none) / ${TIMES}`);
  for (const op of OPERATIONS) {
    const row = totals[op].map((us) => us.toFixed(0)).join(" ");
    const per = op === "none" ? "" : `  → ${((median(totals[op]) - base) / TIMES).toFixed(1)} µs each`;
    console.log(`${op.padEnd(18)} ${row}${per}`);
  }
} finally {
  await mf.dispose();
  removeDir(dir);
}
