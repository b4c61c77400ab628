// Starts the worker under workerd (through Miniflare) on 127.0.0.1 with an OS-chosen port,
// configured from wrangler.toml (read by wrangler itself, so the tests run the bindings that
// deploy), with variables overridden per test. No network: `cf: false`, and wrangler's
// telemetry and update checks are off.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

process.env.WRANGLER_SEND_METRICS = "false";
process.env.WRANGLER_HIDE_BANNER = "true";
process.env.CLOUDFLARE_CF_FETCH_ENABLED = "false";

const { Miniflare } = await import("miniflare");
const { unstable_getMiniflareWorkerOptions } = await import("wrangler");

export const EXAMPLE_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..");
/** The idem-wasm package directory: the worker imports its built workerd entry. */
export const PACKAGE_DIR = resolve(EXAMPLE_DIR, "../..");

const fromToml = unstable_getMiniflareWorkerOptions(join(EXAMPLE_DIR, "wrangler.toml")).workerOptions;

/** A fresh directory for Durable Object state; `removeDir` deletes it. */
export function tempDir(prefix = "idem-worker-") {
  return mkdtempSync(join(tmpdir(), prefix));
}

export function removeDir(dir) {
  rmSync(dir, { recursive: true, force: true });
}

/**
 * Starts the worker. `vars` override wrangler.toml's [vars]; `persist` is a directory for
 * Durable Object state (kept across restarts), or undefined for state in memory. Resolves to
 * `{ url, mf, dispose }`; `url` ends without a slash. `entry` is the worker module (tests
 * that look into Durable Object storage use a fixture that re-exports the worker).
 * `miniflare`: more Miniflare options (an `inspectorPort` for a profiler). `keyValue`: every
 * Durable Object class on the key-value storage backend (wrangler's `new_classes`) instead of
 * SQLite.
 */
export async function startWorker({ vars = {}, persist, entry = "src/worker.js", miniflare = {}, keyValue = false } = {}) {
  const durableObjects = Object.fromEntries(
    Object.entries(fromToml.durableObjects).map(([binding, options]) => [binding, keyValue ? { ...options, useSQLite: false } : options]),
  );
  const mf = new Miniflare({
    name: "idem-orders",
    modules: true,
    modulesRoot: PACKAGE_DIR,
    scriptPath: join(EXAMPLE_DIR, entry),
    modulesRules: [
      { type: "ESModule", include: ["**/*.js", "**/*.mjs"] },
      { type: "CompiledWasm", include: ["**/*.wasm"] },
    ],
    compatibilityDate: fromToml.compatibilityDate,
    compatibilityFlags: fromToml.compatibilityFlags,
    bindings: { ...fromToml.bindings, IDEM_LOG_EVENTS: "off", ...vars },
    durableObjects,
    durableObjectsPersist: persist ?? false,
    host: "127.0.0.1",
    port: 0,
    cf: false,
    ...miniflare,
  });
  let url;
  try {
    url = (await mf.ready).toString().replace(/\/$/, "");
  } catch (err) {
    await mf.dispose().catch(() => {});
    throw err;
  }
  let disposed = false;
  return {
    url,
    mf,
    async dispose() {
      if (disposed) return;
      disposed = true;
      await mf.dispose();
    },
  };
}

/** The worker module whose orders object also answers `GET /__storage` (test/fixtures). */
export const INSPECTABLE = "test/fixtures/inspectable.js";

/** What the orders object holds of the idempotency records of `POST /orders` (they live
 * beside the orders, under the store's prefix): `{ records, deadlines, alarms }`. Needs a
 * worker started with `entry: INSPECTABLE`. */
export async function objectStorage(mf) {
  const ns = await mf.getDurableObjectNamespace("LEDGER");
  const r = await ns.get(ns.idFromName("orders")).fetch("http://ledger/__storage");
  const { keys, alarm } = await r.json();
  return {
    records: keys.filter((k) => k.startsWith("idem:r:")).length,
    deadlines: keys.filter((k) => k.startsWith("idem:d:")).length,
    alarms: alarm === null ? [] : [alarm],
  };
}

/** `GET /count`: `{ count, orders }`, the handler runs and the committed orders. */
export async function ledger(url) {
  const response = await fetch(`${url}/count`, { signal: AbortSignal.timeout(10_000) });
  if (!response.ok) throw new Error(`GET /count answered ${response.status}`);
  return response.json();
}

/** `GET /count`: the number of order executions. */
export async function count(url) {
  return (await ledger(url)).count;
}

/** A POST to /orders (or `path`) with a bounded wait. */
export function post(url, { key, body = '{"amount":4200,"currency":"eur"}', headers = {}, path = "/orders" } = {}) {
  const h = { "content-type": "application/json", authorization: "Bearer a", ...headers };
  if (key !== undefined) h["idempotency-key"] = key;
  return fetch(`${url}${path}`, { method: "POST", headers: h, body, signal: AbortSignal.timeout(10_000) });
}

/**
 * One HTTP/1.1 request on its own connection, written byte for byte (header values that
 * Fetch would refuse or normalise: raw bytes, repeated headers). `head` is the list of header
 * lines without Host and Content-Length. Resolves to `{ status, headers, body }` with header
 * names in lower case; rejects after `timeout` ms. With `release` (a promise), the connection
 * is opened at once and the request written when `release` resolves.
 */
export function rawRequest(url, { method = "POST", path = "/orders", head = [], body = Buffer.alloc(0), timeout = 10_000, release }) {
  const { hostname, port } = new URL(url);
  const payload = Buffer.isBuffer(body) ? body : Buffer.from(body);
  const lines = [`${method} ${path} HTTP/1.1`, `host: ${hostname}:${port}`, "connection: close", ...head, `content-length: ${payload.length}`];
  const request = Buffer.concat([...lines.map((l) => Buffer.from(`${l}\r\n`, "latin1")), Buffer.from("\r\n"), payload]);
  return new Promise((resolve, reject) => {
    const socket = connect({ host: hostname, port: Number(port) });
    const chunks = [];
    let settled = false;
    const finish = (err, value) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      if (err) reject(err);
      else resolve(value);
    };
    const timer = setTimeout(() => finish(new Error(`no answer within ${timeout} ms`)), timeout);
    socket.on("connect", async () => {
      if (release !== undefined) await release;
      socket.write(request);
    });
    socket.on("data", (c) => {
      chunks.push(c);
      const response = completeResponse(Buffer.concat(chunks));
      if (response !== null) finish(null, response);
    });
    // A server that answers before reading the whole body (413) may reset the connection
    // while the request is still being written: the answer read before the reset counts.
    let failure = null;
    socket.on("error", (err) => {
      failure = err;
    });
    socket.on("close", () => {
      try {
        finish(null, parseResponse(Buffer.concat(chunks)));
      } catch (err) {
        finish(failure ?? err);
      }
    });
  });
}

/** The response in `bytes` once all of it has arrived (by Content-Length or the last
 * chunk), else null. */
function completeResponse(bytes) {
  const end = bytes.indexOf("\r\n\r\n");
  if (end < 0) return null;
  const head = bytes.subarray(0, end).toString("latin1");
  const length = /\r\ncontent-length:\s*(\d+)/i.exec(head);
  if (length !== null) return bytes.length - end - 4 >= Number(length[1]) ? parseResponse(bytes) : null;
  if (/\r\ntransfer-encoding:\s*chunked/i.test(head)) {
    return bytes.subarray(end).includes("\r\n0\r\n\r\n") ? parseResponse(bytes) : null;
  }
  return null;
}

function parseResponse(bytes) {
  const end = bytes.indexOf("\r\n\r\n");
  if (end < 0) throw new Error(`not an HTTP response: ${JSON.stringify(bytes.toString("latin1").slice(0, 200))}`);
  const [statusLine, ...headerLines] = bytes.subarray(0, end).toString("latin1").split("\r\n");
  const status = Number(statusLine.split(" ")[1]);
  const headers = {};
  for (const line of headerLines) {
    const i = line.indexOf(":");
    headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
  }
  let body = bytes.subarray(end + 4);
  if (/chunked/i.test(headers["transfer-encoding"] ?? "")) {
    const parts = [];
    let at = 0;
    for (;;) {
      const lineEnd = body.indexOf("\r\n", at);
      const size = parseInt(body.subarray(at, lineEnd).toString("latin1"), 16);
      if (!(size > 0)) break;
      parts.push(body.subarray(lineEnd + 2, lineEnd + 2 + size));
      at = lineEnd + 2 + size + 2;
    }
    body = Buffer.concat(parts);
  }
  return { status, headers, body: body.toString("utf8") };
}

export { assertOneExecutionPerRound, conformanceBinary, runProcess } from "../../../test/conformance.mjs";
