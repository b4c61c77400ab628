// idempotentFetch with the key kinds, against a server of the built package over loopback:
// a timestamp key taken once and kept across retries, and counter keys whose numbering
// lives in the persistence hook, so that a restarted client (another process) continues
// its sequence and never reuses a number, with the low-water mark advancing.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { Idempotency, MemoryStore, withIdempotency } from "idem";
import { idempotentFetch } from "idem/client";
import { serve } from "./helpers.mjs";

function server(kind) {
  const seen = [];
  let executions = 0;
  let failFirst = kind.failFirst ?? 0;
  const idem = new Idempotency({ store: new MemoryStore(), principal: "none", ...kind.options });
  const handler = withIdempotency(async (request) => {
    executions++;
    if (failFirst > 0) {
      failFirst--;
      return new Response("busy", { status: 503 });
    }
    return Response.json({ n: executions, body: await request.json() }, { status: 201 });
  }, idem);
  return {
    idem,
    seen,
    executions: () => executions,
    handler: async (request) => {
      seen.push({ key: request.headers.get("idempotency-key"), low: request.headers.get("idempotency-low-water") });
      return handler(request);
    },
  };
}

test("a timestamp key is taken once and every retry sends it (IDEM-TIME-1)", async () => {
  const s = server({ options: { keyKind: "unix-time" }, failFirst: 1 });
  const http = await serve(s.handler);
  try {
    const result = await idempotentFetch(`${http.url}/payments`, { method: "POST", body: "{}", headers: { "content-type": "application/json" } }, { keyKind: "unix-time", clientId: "app-7", retry: { base: 1, cap: 5 } });
    assert.equal(result.outcome, "completed");
    assert.equal(s.seen.length, 2);
    assert.match(s.seen[0].key, /^app-7:\d{13}$/);
    assert.equal(s.seen[1].key, s.seen[0].key);
  } finally {
    await http.close();
  }
});

test("two timestamp keys of one client in one millisecond are two keys: each request runs (IDEM-TIME-1)", async () => {
  const s = server({ options: { keyKind: "unix-time" } });
  const http = await serve(s.handler);
  try {
    // One clock reading for every call: as many requests in one millisecond as there are.
    const at = Date.now();
    const now = () => at;
    const calls = [1, 2, 3].map((n) =>
      idempotentFetch(`${http.url}/payments`, { method: "POST", body: JSON.stringify({ n }), headers: { "content-type": "application/json" } }, { keyKind: "unix-time", clientId: "app-8", now, retry: { base: 1, cap: 5 } }),
    );
    const results = await Promise.all(calls);
    assert.deepEqual(results.map((r) => r.outcome), ["completed", "completed", "completed"]);
    assert.equal(new Set(results.map((r) => r.key)).size, 3, "three keys");
    assert.equal(s.executions(), 3);
    for (const r of results) assert.match(r.key, /^app-8:\d{13}$/);
  } finally {
    await http.close();
  }
});

test("counter keys continue across a restart from the persistence hook, with the low-water mark (IDEM-CTR-8, IDEM-CTR-11)", async () => {
  const s = server({ options: { keyKind: "counter", counter: { bits: 8, window: 8 } } });
  const http = await serve(s.handler);
  const dir = mkdtempSync(join(tmpdir(), "idem-client-"));
  try {
    const { epoch } = await s.idem.openSession({ method: "POST", target: "/sessions", key: null }, { route: "/transfers", client: "app-7" });
    // Each client run is its own process, sharing only the persistence file.
    // Asynchronously: the server answers from this process's event loop meanwhile.
    const client = async (n) => {
      const { stdout } = await promisify(execFile)(process.execPath, ["--input-type=module", "-e", CLIENT], {
        env: { ...process.env, URL: `${http.url}/transfers`, EPOCH: epoch, N: String(n), STATE: join(dir, "state.json") },
        cwd: process.cwd(),
        timeout: 60_000,
      });
      return stdout.trim();
    };
    assert.equal(await client(3), "completed completed completed");
    assert.equal(await client(2), "completed completed");
    const keys = s.seen.map((r) => r.key);
    assert.deepEqual(keys, [0, 1, 2, 3, 4].map((n) => `app-7:${epoch}:${n}`));
    // Sent one after the other, each request's low-water mark is its own number.
    assert.deepEqual(s.seen.map((r) => r.low), ["0", "1", "2", "3", "4"]);
    assert.equal(s.executions(), 5);
  } finally {
    await http.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

// The start of a client process's program: idempotentFetch, and a persist store in the JSON
// file named by STATE.
const FILE_PERSIST = `
import { readFileSync, writeFileSync, existsSync } from "node:fs";
import { idempotentFetch } from "idem/client";
const file = process.env.STATE;
const read = () => (existsSync(file) ? JSON.parse(readFileSync(file, "utf8")) : {});
const persist = {
  load: (id) => (read()[id] ? Uint8Array.from(Buffer.from(read()[id], "base64")) : null),
  save: (id, bytes) => writeFileSync(file, JSON.stringify({ ...read(), [id]: Buffer.from(bytes).toString("base64") })),
  delete: (id) => { const s = read(); delete s[id]; writeFileSync(file, JSON.stringify(s)); },
};
`;

// A client process: N requests through idempotentFetch with counter keys, its state in a
// JSON file. Prints the outcomes.
const CLIENT = `${FILE_PERSIST}const out = [];
for (let i = 0; i < Number(process.env.N); i++) {
  const r = await idempotentFetch(process.env.URL, { method: "POST", body: JSON.stringify({ i }), headers: { "content-type": "application/json" } },
    { keyKind: "counter", counter: { client: "app-7", epoch: process.env.EPOCH, bits: 8 }, persist, id: "req-" + Date.now() + "-" + i });
  out.push(r.outcome);
}
console.log(out.join(" "));
`;

/** A persistence hook over a Map, as the tests in this process use it. */
function mapPersist() {
  const map = new Map();
  return { map, load: async (id) => map.get(id) ?? null, save: async (id, bytes) => void map.set(id, bytes), delete: async (id) => void map.delete(id) };
}

const json = (body) => ({ method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json" } });

test("a client with sessions on two routes numbers each epoch on its own: A, B, A are three requests, in one process and after a restart (IDEM-CTR-1, IDEM-CTR-7)", async () => {
  const s = server({ options: { keyKind: "counter", counter: { bits: 8, window: 8 } } });
  const http = await serve(s.handler);
  const dir = mkdtempSync(join(tmpdir(), "idem-client-"));
  try {
    const open = async (route) => (await s.idem.openSession({ method: "POST", target: "/sessions", key: null }, { route, client: "two-routes" })).epoch;
    const [a, b] = [await open("/a"), await open("/b")];
    assert.notEqual(a, b);
    // Each client run is its own process, sharing only the persistence file.
    const client = async (calls) => {
      const { stdout } = await promisify(execFile)(process.execPath, ["--input-type=module", "-e", CALLS], {
        env: { ...process.env, CALLS: JSON.stringify(calls.map(([route, epoch]) => [`${http.url}${route}`, epoch])), STATE: join(dir, "state.json") },
        cwd: process.cwd(),
        timeout: 60_000,
      });
      return stdout.trim();
    };
    // The same payload each time: a number given twice would be answered with the first one's replay.
    assert.equal(await client([["/a", a], ["/b", b], ["/a", a]]), "completed completed completed");
    assert.equal(await client([["/a", a], ["/b", b]]), "completed completed");
    assert.deepEqual(
      s.seen.map((r) => r.key),
      [`${a}:0`, `${b}:0`, `${a}:1`, `${a}:2`, `${b}:1`].map((k) => `two-routes:${k}`),
    );
    assert.deepEqual(s.seen.map((r) => r.low), ["0", "0", "1", "2", "1"]);
    assert.equal(s.executions(), 5);
  } finally {
    await http.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

// A client process: one request per [url, epoch] of CALLS with counter keys of client
// "two-routes", all with the same payload, its state in a JSON file. Prints the outcomes.
const CALLS = `${FILE_PERSIST}const out = [];
for (const [url, epoch] of JSON.parse(process.env.CALLS)) {
  const r = await idempotentFetch(url, { method: "POST", body: '{"amount":1}', headers: { "content-type": "application/json" } },
    { keyKind: "counter", counter: { client: "two-routes", epoch, bits: 8 }, persist, id: "req-" + out.length });
  out.push(r.response?.headers.get("idempotent-replayed") === "true" ? "replayed" : r.outcome);
}
console.log(out.join(" "));
`;

test("a late call with the epoch a session was opened again from leaves the new epoch's numbering alone (IDEM-CTR-4, IDEM-CTR-5)", async () => {
  const s = server({ options: { keyKind: "counter", counter: { bits: 8, window: 8 } } });
  const http = await serve(s.handler);
  try {
    const persist = mapPersist();
    const open = async () => (await s.idem.openSession({ method: "POST", target: "/sessions", key: null }, { route: "/t", client: "reopened" })).epoch;
    const call = (epoch, id) => idempotentFetch(`${http.url}/t`, json({ amount: 1 }), { keyKind: "counter", counter: { client: "reopened", epoch, bits: 8 }, persist, id });
    const e1 = await open();
    assert.equal((await call(e1, "1")).outcome, "completed");
    const e2 = await open();
    assert.equal((await call(e2, "2")).outcome, "completed");
    // Still made with the old epoch: refused, nothing runs.
    const late = await call(e1, "3");
    assert.equal(late.outcome, "rejected");
    assert.equal(late.status, 412);
    const next = await call(e2, "4");
    assert.equal(next.outcome, "completed");
    assert.equal(next.response.headers.get("idempotent-replayed"), null);
    assert.equal(next.key, `reopened:${e2}:1`);
    assert.equal(s.seen.at(-1).low, "1");
    assert.equal(s.executions(), 3);
    // Every time the session is opened again, the old epoch's numbering (none of its numbers
    // open) is dropped: the record keeps one numbering.
    const record = () => persist.map.get("idem-counter:reopened").length;
    const size = record();
    for (let i = 0; i < 20; i++) {
      const epoch = await open();
      assert.equal((await call(epoch, `r${i}`)).key, `reopened:${epoch}:0`);
      assert.ok(record() <= size + 1, `the record stays one numbering: ${record()} bytes`);
    }
    assert.equal(s.executions(), 23);
  } finally {
    await http.close();
  }
});

test("a request that ends under its old epoch gives its number back to that epoch's numbering, not to the options' (IDEM-CTR-11)", async () => {
  const s = server({ options: { keyKind: "counter", counter: { bits: 8, window: 8 } } });
  const http = await serve(s.handler);
  try {
    const persist = mapPersist();
    const open = async () => (await s.idem.openSession({ method: "POST", target: "/sessions", key: null }, { route: "/u", client: "resumed" })).epoch;
    const options = (epoch, id, more) => ({ keyKind: "counter", counter: { client: "resumed", epoch, bits: 8 }, persist, id, ...more });
    const e1 = await open();
    // "x" is answered, and the process stops before its entry is deleted: its number stays open.
    const stop = new Error("stopped");
    await assert.rejects(idempotentFetch(`${http.url}/u`, json({ id: "x" }), options(e1, "x", { persist: { ...persist, delete: async () => { throw stop; } } })), stop);
    const e2 = await open();
    // "y" is stopped while its request is on its way: its number, e2's 0, stays open.
    const controller = new AbortController();
    const lost = async () => {
      controller.abort();
      throw controller.signal.reason;
    };
    await assert.rejects(idempotentFetch(`${http.url}/u`, { ...json({ id: "y" }), signal: controller.signal }, options(e2, "y", { fetch: lost })));
    // "x" again, while the app holds the new epoch: its saved answer, and e1's number 0 given back.
    const x = await idempotentFetch(`${http.url}/u`, json({ id: "x" }), options(e2, "x"));
    assert.deepEqual([x.outcome, x.key], ["completed", `resumed:${e1}:0`]);
    // e2's number 0 is still open: the low-water mark stays there.
    const z = await idempotentFetch(`${http.url}/u`, json({ id: "z" }), options(e2, "z"));
    assert.deepEqual([z.outcome, z.key], ["completed", `resumed:${e2}:1`]);
    assert.equal(s.seen.at(-1).low, "0");
    assert.equal(s.executions(), 2);
  } finally {
    await http.close();
  }
});

test("counter options are checked (IDEM-JS-1)", async () => {
  await assert.rejects(idempotentFetch("http://127.0.0.1:9/x", { method: "POST" }, { keyKind: "counter" }), (e) => e.code === "IDEM-JS-1");
  await assert.rejects(idempotentFetch("http://127.0.0.1:9/x", { method: "POST" }, { keyKind: "ulid" }), (e) => e.code === "IDEM-JS-1");
});
