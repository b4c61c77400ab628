// The release build of idem-conformance and a way to run it, shared by the package's tests
// and the worker example's.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root. */
const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..");

/** The release build of idem-conformance: $IDEM_CONFORMANCE, or the workspace's target dir. */
export function conformanceBinary() {
  const root = ROOT;
  const candidates = [
    process.env.IDEM_CONFORMANCE,
    process.env.CARGO_TARGET_DIR && join(process.env.CARGO_TARGET_DIR, "release/idem-conformance"),
    join(root, "target/release/idem-conformance"),
  ].filter(Boolean);
  const found = candidates.find((p) => existsSync(p));
  if (!found) {
    throw new Error(
      `idem-conformance is not built (looked at ${candidates.join(", ")}): run \`cargo build --release -p idem-conformance\` or set IDEM_CONFORMANCE`,
    );
  }
  return found;
}

/** Runs `bin` with `args`, killed after `timeoutMs`: `{ code, signal, stdout, stderr }`. */
export function runProcess(bin, args, timeoutMs) {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (c) => (stdout += c));
    child.stderr.on("data", (c) => (stderr += c));
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.on("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr });
    });
  });
}

/** Checks the concurrent case of a JSON report: it passed with high confidence, the count
 * oracle saw one execution in each of `rounds` rounds, and every round answered all
 * `concurrency` requests. Returns the case. */
export function assertOneExecutionPerRound(report, { rounds, concurrency }) {
  const concurrent = report.cases.find((c) => c.id === "concurrent/1");
  assert.ok(concurrent, "concurrent/1 is missing from the report");
  assert.equal(concurrent.verdict, "pass", concurrent.reason);
  assert.equal(concurrent.confidence, "high", concurrent.reason);
  assert.match(concurrent.reason, new RegExp(`exactly one execution in each of ${rounds} rounds`));
  const notes = concurrent.notes.filter((n) => /^round \d+:/.test(n));
  assert.equal(notes.length, rounds);
  for (const note of notes) {
    const answered = [...note.matchAll(/(\d{3})×(\d+)/g)].reduce((sum, m) => sum + Number(m[2]), 0);
    assert.equal(answered, concurrency, note);
  }
  return concurrent;
}
