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

// A client process: N requests through idempotentFetch with counter keys, its state in a
// JSON file. Prints the outcomes.
const CLIENT = `
import { readFileSync, writeFileSync, existsSync } from "node:fs";
import { idempotentFetch } from "idem/client";
const file = process.env.STATE;
const read = () => (existsSync(file) ? JSON.parse(readFileSync(file, "utf8")) : {});
const persist = {
  load: (id) => (read()[id] ? Uint8Array.from(Buffer.from(read()[id], "base64")) : null),
  save: (id, bytes) => writeFileSync(file, JSON.stringify({ ...read(), [id]: Buffer.from(bytes).toString("base64") })),
  delete: (id) => { const s = read(); delete s[id]; writeFileSync(file, JSON.stringify(s)); },
};
const out = [];
for (let i = 0; i < Number(process.env.N); i++) {
  const r = await idempotentFetch(process.env.URL, { method: "POST", body: JSON.stringify({ i }), headers: { "content-type": "application/json" } },
    { keyKind: "counter", counter: { client: "app-7", epoch: process.env.EPOCH, bits: 8 }, persist, id: "req-" + Date.now() + "-" + i });
  out.push(r.outcome);
}
console.log(out.join(" "));
`;

test("counter options are checked (IDEM-JS-1)", async () => {
  await assert.rejects(idempotentFetch("http://127.0.0.1:9/x", { method: "POST" }, { keyKind: "counter" }), (e) => e.code === "IDEM-JS-1");
  await assert.rejects(idempotentFetch("http://127.0.0.1:9/x", { method: "POST" }, { keyKind: "ulid" }), (e) => e.code === "IDEM-JS-1");
});
