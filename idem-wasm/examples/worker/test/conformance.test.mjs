// The conformance suite against the worker under workerd: every case, with the count
// oracle, 32 concurrent duplicates per round over 5 rounds, lost responses, two principals,
// stored and released error outcomes, the expiry windows, and the status query with its
// settle (IDEM-EXEC-1, IDEM-CONC-1, IDEM-TTL-1, IDEM-TTL-2, IDEM-TTL-3, IDEM-STATUS-1 to
// IDEM-STATUS-4), with claims held in the orders object's memory
// (IDEM-STORE-8). A crash taken over after the lease (IDEM-LEASE-1) needs a claim that
// outlives the object: that case runs with claims written (ORDER_WRITES_ONLY = "off").
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { assertOneExecutionPerRound, conformanceBinary, removeDir, runProcess as run, startWorker, tempDir } from "./runtime.mjs";

const CONCURRENCY = 32;
const ROUNDS = 5;
// Short retention and lease, so that the opt-in expiry and lease cases run in seconds.
const RESPONSE_TTL_MS = 2000;
const KEY_TTL_MS = 4000;
const LEASE_MS = 1000;
// Handler work: long enough that concurrent duplicates overlap the first attempt and some
// get 409 in progress (concurrent/2 checks their Retry-After).
const ORDER_DELAY_MS = 50;

const order = (outcome) => JSON.stringify({ amount: 4200, currency: "eur", outcome });

/** Runs idem-conformance with `args` against a worker started with `vars`; resolves to
 * `{ report, output, junit }`, having checked that it exited with 0. */
async function conformance(vars, args) {
  const bin = conformanceBinary();
  const dir = tempDir();
  const worker = await startWorker({
    persist: join(dir, "state"),
    vars: {
      IDEM_RESPONSE_TTL_MS: String(RESPONSE_TTL_MS),
      IDEM_KEY_TTL_MS: String(KEY_TTL_MS),
      IDEM_LEASE_MS: String(LEASE_MS),
      ORDER_DELAY_MS: String(ORDER_DELAY_MS),
      ...vars,
    },
  });
  try {
    const json = join(dir, "conformance.json");
    const junit = join(dir, "conformance.xml");
    const { url } = worker;
    const result = await run(
      bin,
      [
        "run",
        `${url}/orders`,
        "--count-url",
        `${url}/count`,
        "-H",
        "Authorization: Bearer a",
        "--lease",
        String(LEASE_MS / 1000),
        // idem's own levels, strictly: the worker is held to every expectation, and keys
        // are quoted sf-strings so that keys/6 runs too.
        "--profile",
        "idem",
        "--strict",
        "--key-style",
        "sf-string",
        "--json",
        json,
        "--junit",
        junit,
        "--quiet",
        ...args,
      ],
      120_000,
    );
    const output = `${result.stdout}\n${result.stderr}`;
    assert.equal(result.code, 0, `idem-conformance exited with ${result.code ?? result.signal}:\n${output}`);
    const report = JSON.parse(readFileSync(json, "utf8"));
    assert.equal(report.exit_code, 0);
    return { report, output, junit: readFileSync(junit, "utf8") };
  } finally {
    await worker.dispose();
    removeDir(dir);
  }
}

test("idem-conformance passes every case against the worker under workerd, claims held in memory", { timeout: 150_000 }, async () => {
  const { report, output, junit } = await conformance({ ORDER_WRITES_ONLY: "on" }, [
    "--concurrency",
    String(CONCURRENCY),
    "--rounds",
    String(ROUNDS),
    "--second-credential",
    "Authorization: Bearer b",
    "--response-ttl",
    String(RESPONSE_TTL_MS / 1000),
    "--key-ttl",
    String(KEY_TTL_MS / 1000),
    "--decline-body",
    order("decline"),
    "--fail-body",
    order("unavailable"),
  ]);
  // The key kinds' families need endpoints of their kinds, and the crash case a claim that
  // outlives the object: they skip here.
  const skipped = report.cases.filter((c) => ["time", "counter", "token"].includes(c.section) || c.id === "lease/1");
  assert.ok(skipped.every((c) => c.verdict === "skip"), output);
  assert.ok(skipped.some((c) => c.id === "lease/1"), "lease/1 is in the report");
  assert.deepEqual(
    report.summary,
    { pass: report.cases.length - skipped.length, non_strict: 0, fail: 0, unsafe: 0, leak: 0, skip: skipped.length, error: 0 },
    output,
  );
  const byId = new Map(report.cases.map((c) => [c.id, c]));
  // Every case ran (none skipped for a missing option) and passed on the oracle's word.
  for (const id of [
    "lost-response/1",
    "replay/1",
    "replay/2",
    "replay/3",
    "concurrent/1",
    "concurrent/2",
    "mismatch/1",
    "keys/1",
    "keys/2",
    "keys/3",
    "keys/4",
    "keys/5",
    "keys/6",
    "errors/1",
    "errors/2",
    "scope/1",
    "expiry/1",
    "expiry/2",
    "expiry/3",
    "status/1",
    "status/3",
    "status/4",
    "status/5",
    "status/6",
    "status/7",
  ]) {
    const c = byId.get(id);
    assert.ok(c, `case ${id} is missing from the report`);
    assert.equal(c.verdict, "pass", `${id}: ${c.reason}`);
  }
  for (const c of report.cases) {
    if (c.level === "MUST" && !skipped.includes(c)) assert.equal(c.verdict, "pass", `${c.id}: ${c.reason}`);
  }
  // Concurrent duplicates: every round fired 32 requests, and the count oracle saw one
  // execution per round.
  assertOneExecutionPerRound(report, { rounds: ROUNDS, concurrency: CONCURRENCY });
  const lost = byId.get("lost-response/1");
  assert.equal(lost.confidence, "high", lost.reason);
  assert.match(junit, /<testsuite[^>]* failures="0"/);
});

test("with claims written, an order whose object died is taken over after the lease as recovered (lease/1)", { timeout: 60_000 }, async () => {
  const { report, output } = await conformance({ ORDER_WRITES_ONLY: "off" }, ["--case", "lease", "--crash-body", order("crash")]);
  assert.deepEqual(
    report.cases.map((c) => [c.id, c.verdict]),
    [["lease/1", "pass"]],
    output,
  );
});
