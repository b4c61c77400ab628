// The JavaScript↔WebAssembly boundary: everything that crosses is defined once, in Rust
// (src/interop/) or idem-core, and this checks that the JavaScript side agrees with it.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";
import { Idempotency, MemoryStore, expire } from "idem";
import { idempotentFetch } from "idem/client";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
// The glue wasm-bindgen generated for the module of this build (the package bundles and
// minifies it; here its exports are read by name).
const target = JSON.parse(
  execFileSync(process.env.CARGO || "cargo", ["metadata", "--format-version", "1", "--no-deps"], { cwd: root, encoding: "utf8" }),
).target_directory;
const glue = await import(join(target, "idem-wasm-bindgen", "idem_wasm.js"));
glue.initSync({ module: readFileSync(join(target, "idem-wasm-bindgen", "idem_wasm_bg.wasm")) });
// The client's module, its loader and the JavaScript that calls its one entry point, as the
// build staged them side by side; the numbers they share (js/client-codes/) are written from
// the module's Rust enums and checked by tests/client_codes.rs.
const stage = join(target, "idem-wasm-stage");
const clientModule = await import(join(stage, "client-module.js"));
clientModule.initSync({ module: readFileSync(join(root, "dist", "idem_client_bg.wasm")) });
const outbox = await import(join(stage, "outbox.js"));
/** An enum of js/client-codes/ as an object, its members in number order. */
const codes = async (file) => Object.fromEntries(Object.entries(await import(join(stage, "client-codes", file))).sort(([, a], [, b]) => a - b));
const clientSide = {
  ClientOp: await codes("op.js"),
  Wire: await codes("wire.js"),
  FetchOutcome: await codes("fetch-outcome.js"),
  NextKind: await codes("next-kind.js"),
  OutboxState: await codes("outbox-state.js"),
  call: clientModule.call,
};
const { ClientOp, Wire } = clientSide;
/** The names the client's JavaScript sends and reads (js/client-codes/names.js, written from
 * the Rust by tests/client_codes.rs). */
const clientNames = await import(join(stage, "client-codes", "names.js"));
const sources = readdirSync(join(root, "js"))
  .filter((f) => f.endsWith(".js"))
  .map((f) => [f, readFileSync(join(root, "js", f), "utf8")]);
// The worker example's own sources.
const workerDir = join(root, "examples", "worker", "src");
const workerSources = readdirSync(workerDir)
  .filter((f) => f.endsWith(".js"))
  .map((f) => [`examples/worker/src/${f}`, readFileSync(join(workerDir, f), "utf8")]);

/** A source's code without its comments. */
function code(text) {
  return text.replace(/\/\*[\s\S]*?\*\//g, "").replace(/^\s*\/\/.*$/gm, "");
}

test("every enum member the JavaScript side names exists in the module, with the same meaning", () => {
  const enums = {
    Step: glue.StepKind,
    Ran: glue.Ran,
    HeartbeatState: glue.HeartbeatState,
    WriteFlag: glue.WriteFlag,
    ReplyFlag: glue.ReplyFlag,
    // The client's module.
    OutboxState: clientSide.OutboxState,
    NextKind: clientSide.NextKind,
    FetchOutcome: clientSide.FetchOutcome,
    ClientOp,
    Wire,
  };
  const named = new RegExp(`\\b(${Object.keys(enums).join("|")})\\.([A-Za-z]+)\\b`, "g");
  let used = 0;
  for (const [file, text] of sources) {
    for (const [, name, member] of text.matchAll(named)) {
      assert.equal(typeof enums[name][member], "number", `${file}: ${name}.${member} is not exported by the module`);
      used++;
    }
    // No numeric codes are written out by hand: steps and outcomes are compared by name.
    assert.doesNotMatch(text, /\b(step|code|kind)\s*[!=]==\s*\d/, `${file} compares a code with a number`);
    assert.doesNotMatch(text, /&\s*7\)|>>\s*4\b/, `${file} unpacks a bit field by hand`);
  }
  assert.ok(used >= 16, `the sources name ${used} enum members`);
  // Every step has a distinct value and a name both ways.
  const steps = Object.keys(glue.StepKind).filter((k) => Number.isNaN(Number(k)));
  assert.deepEqual(steps, ["Claim", "Load", "Apply", "WaitUntil", "Run", "Idle", "Reply", "Done"]);
  for (const s of steps) assert.equal(glue.StepKind[glue.StepKind[s]], s);
});

test("the options the types document are exactly the host's and the engine's", () => {
  const engine = glue.engineOptionNames().split(",");
  const options = sources.find(([f]) => f === "options.js")[1];
  const host = JSON.parse(options.match(/const HOST_OPTIONS = (\[[^\]]*\]);/)[1]);
  assert.deepEqual(host.filter((n) => engine.includes(n)), [], "no option is read on both sides");
  const types = readFileSync(join(root, "types", "index.d.ts"), "utf8");
  const block = types.slice(types.indexOf("export interface IdempotencyOptions"), types.indexOf("/** What a handler learns"));
  const documented = [...block.matchAll(/^ {2}(\w+)\??:/gm)].map((m) => m[1]);
  assert.deepEqual([...documented].sort(), [...host, ...engine].sort());
});

test("event names cross as indices into the core's list, with their security flags", () => {
  const names = glue.eventNames().split(",");
  assert.ok(names.includes("executed") && names.includes("fenced-out") && names.includes("tombstone-hit"));
  const mask = glue.securityMask();
  const flagged = names.filter((_, i) => (mask & (1 << i)) !== 0);
  assert.deepEqual(flagged.sort(), ["fenced-out", "forged", "mismatch", "stale", "tombstone-hit"]);
});

/** A store that keeps every write it is given, through a request's whole life. */
function recordingStore() {
  const writes = [];
  const records = new Map();
  const store = {
    async load(key) {
      return records.get(key) ?? null;
    },
    async apply(key, write) {
      writes.push(write);
      const current = records.get(key) ?? null;
      if ((write.expect === null) !== (current === null) || (current !== null && current.version !== write.expect)) return false;
      if (write.value === null) records.delete(key);
      else records.set(key, { version: write.version, value: write.value });
      return true;
    },
  };
  return { store, writes, records };
}

test("write bytes decode what the module wrote: each flag alone, versions, deletes, large records", async () => {
  // Every flag is its own bit, so that each can be told from the others.
  const flags = Object.keys(glue.WriteFlag).filter((k) => Number.isNaN(Number(k)));
  assert.deepEqual(flags.sort(), ["Expect", "InFlight", "StoresResponse", "Value"]);
  assert.equal(flags.reduce((all, f) => all | glue.WriteFlag[f], 0), 15);
  const { store, writes, records } = recordingStore();
  const idem = new Idempotency({ store, principal: "none" });
  const body = new Uint8Array(200_000).map((_, i) => (i * 7) % 256);
  const before = Date.now();
  const reply = await idem.handle({ method: "POST", target: "/w", key: '"w1"', body: new Uint8Array() }, () => ({ status: 201, headers: [], body }));
  assert.equal(reply.status, 201);
  const [claim, completion] = writes;
  assert.equal(writes.length, 2);
  assert.equal(claim.expect, null);
  assert.equal(claim.inFlight, true);
  assert.equal(claim.storesResponse, false);
  assert.match(claim.version, /^[0-9]+$/);
  assert.ok(claim.deadline >= before && claim.expires >= claim.deadline, "the lease's end, then the key's");
  assert.equal(completion.expect, claim.version);
  assert.equal(completion.inFlight, false);
  assert.equal(completion.storesResponse, true);
  assert.ok(completion.value.byteLength > body.byteLength, "the record holds the response");
  assert.notEqual(completion.value.buffer, claim.value.buffer, "each value is a copy");
  // The expiry of a record past its key's retention is a delete.
  const [{ value }] = [...records.values()];
  const gone = expire(completion.expires + 1, value);
  assert.deepEqual({ ...gone, expect: null }, { expect: null, value: null, version: "", deadline: 0, expires: 0, storesResponse: false, inFlight: false });
  assert.equal(expire(before, value), undefined, "nothing due yet");
});

test("context bytes give the handler its parsed key, fence, lease end and takeover", async () => {
  const { store, writes } = recordingStore();
  let now = 1_700_000_000_000;
  const idem = new Idempotency({ store, principal: "none", keyKind: "uuid", lease: 1000, now: () => now });
  const req = { method: "POST", target: "/c", key: '"0F1E2D3C-4B5A-4978-8695-A4B3C2D1E0F9"', body: new Uint8Array() };
  const contexts = [];
  let release;
  const gate = new Promise((resolve) => (release = resolve));
  const first = idem.handle(req, async (context) => {
    contexts.push({ ...context });
    await gate;
    return { status: 201 };
  });
  while (contexts.length < 1) await new Promise((resolve) => setImmediate(resolve));
  const key = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9";
  assert.deepEqual(contexts[0], { key, recovered: false, fence: 1, leaseExpires: now + 1000, extend: contexts[0].extend });
  assert.equal(writes.length, 1, "one claim");
  // Past the lease, a retry takes over: a new fence, a new lease, and `recovered`.
  now += 1001;
  const second = await idem.handle(req, (context) => {
    contexts.push({ ...context });
    return { status: 201 };
  });
  assert.equal(second.status, 201);
  assert.deepEqual(contexts[1], { key, recovered: true, fence: 2, leaseExpires: now + 1000, extend: contexts[1].extend });
  assert.equal(writes.length, 3, "the takeover's claim and its completion");
  release();
  await first;
});

test("reply bytes read in place decode what the module wrote: UTF-8 heads, empty and large bodies", async () => {
  const idem = new Idempotency({ store: new MemoryStore(), principal: "none" });
  const cases = [
    { headers: [["x-note", "café ☕ — ✓"], ["x-empty", ""]], body: new Uint8Array(0) },
    { headers: [["content-type", "application/octet-stream"]], body: new Uint8Array(1 << 20).map((_, i) => i % 256) },
    { headers: [], body: new TextEncoder().encode("𝄞 plain") },
  ];
  for (const [i, c] of cases.entries()) {
    const req = { method: "POST", target: `/b/${i}`, key: `"k${i}"`, body: new Uint8Array() };
    await idem.handle(req, () => ({ status: 200 + i, headers: c.headers, body: c.body }));
    const replay = await idem.handle(req, () => assert.fail("replayed, not run"));
    assert.equal(replay.replayed, true);
    assert.equal(replay.status, 200 + i);
    assert.deepEqual(replay.headers, [...c.headers.flat(), glue.replayedHeader(), "true"]);
    assert.deepEqual(replay.body, c.body);
  }
  // A refusal: the problem body is JSON whose requirement matches the event's code.
  const events = [];
  const refusing = new Idempotency({ store: new MemoryStore(), principal: "none", onEvent: (e) => events.push(e) });
  const r = await refusing.handle({ method: "POST", target: "/x", key: '"a", "b"' }, () => assert.fail("refused"));
  const p = JSON.parse(new TextDecoder().decode(r.body));
  assert.equal(r.status, 400);
  assert.equal(p.requirement, "IDEM-KEY-5");
  assert.equal(events[0].code, "IDEM-KEY-5");
});

test("a sealed MemoryStore counts and sweeps its records with idem-core's figures, read from the module", () => {
  const [overhead, sweep] = glue.memoryAccounting();
  assert.ok(Number.isInteger(overhead) && overhead > 0 && Number.isInteger(sweep) && sweep > 0);
  const text = code(readFileSync(join(root, "js", "sealed-records.js"), "utf8"));
  assert.match(text, /\[ENTRY_OVERHEAD, SWEEP_PER_WRITE\] = memoryAccounting\(\)/);
  assert.doesNotMatch(text, /(ENTRY_OVERHEAD|SWEEP_PER_WRITE)\s*=\s*\d/);
});

test("header names, media types and the problem type prefix are the core's, read from the module or written from it, and no JavaScript writes them", async () => {
  // Both modules name the same headers.
  assert.equal(clientNames.key, glue.keyHeader());
  assert.equal(clientNames.lowWater, glue.lowWaterHeader());
  assert.equal(clientNames.status, glue.statusHeader());
  assert.equal(clientNames.statusMediaType, glue.statusMediaType());
  assert.equal(clientNames.problemMediaType, glue.problemMediaType());
  const names = [glue.keyHeader(), glue.replayedHeader(), glue.lowWaterHeader(), glue.problemTypePrefix(), glue.statusHeader(), glue.statusMediaType()];
  assert.ok(glue.problemTypePrefix().endsWith(":"), glue.problemTypePrefix());
  // The store test kit checks the HTTP contract from outside, as a client does: it states the
  // names as the draft does. Every other file reads them from the module, or from
  // js/client-codes/names.js, which tests/client_codes.rs writes from the Rust.
  for (const [file, text] of [...sources, ...workerSources]) {
    if (file === "store-tests.js") continue;
    for (const name of names) assert.ok(!code(text).toLowerCase().includes(name), `${file} writes "${name}" by hand`);
  }
  // What the server reads, and what the client sends, is the module's.
  const idem = new Idempotency({ store: new MemoryStore(), principal: "none" });
  assert.equal(idem.keyHeader, glue.keyHeader());
  assert.equal(idem.lowWaterHeader, glue.lowWaterHeader());
  const sent = [];
  const result = await idempotentFetch(
    "http://127.0.0.1/t",
    { method: "POST", body: "{}" },
    {
      keyKind: "counter",
      counter: { client: "c1", epoch: "1" },
      fetch: async (_url, init) => {
        sent.push(new Headers(init.headers));
        return new Response("ok", { status: 201 });
      },
    },
  );
  assert.equal(result.outcome, clientNames.outcomes[clientSide.FetchOutcome.Completed]);
  assert.equal(sent.length, 1);
  assert.equal(sent[0].get(glue.keyHeader()), "c1:1:0");
  assert.equal(sent[0].get(glue.lowWaterHeader()), "0");
  // Every problem of the engine's own has a type under the prefix; the worker's own problems
  // have a prefix of their own.
  for (const [key, body] of [['"a", "b"', "{}"], ['"p1"', "{}"], ['"p1"', '{"changed":1}']]) {
    const r = await idem.handle({ method: "POST", target: "/p", key, contentType: "application/json", body: new TextEncoder().encode(body) }, () => ({ status: 201 }));
    if (r.status < 400) continue;
    assert.ok(JSON.parse(new TextDecoder().decode(r.body)).type.startsWith(glue.problemTypePrefix()), `${r.status}`);
  }
  const orders = workerSources.find(([f]) => f.endsWith("orders.js"))[1];
  const own = orders.match(/const EXAMPLE_PROBLEM = "([^"]+)";/)[1];
  assert.ok(!own.startsWith(glue.problemTypePrefix()));
});

test("the engine flags its replies as replays: JavaScript never infers it from the headers", async () => {
  const flags = Object.keys(glue.ReplyFlag).filter((k) => Number.isNaN(Number(k)));
  assert.deepEqual(flags, ["Replayed"]);
  const idem = new Idempotency({ store: new MemoryStore(), principal: "none" });
  // A handler's answer whose own last header is the replay marker: only its replay is one.
  const marked = [["x-a", "1"], [glue.replayedHeader(), "true"]];
  const req = { method: "POST", target: "/r", key: '"r1"', body: new Uint8Array() };
  const first = await idem.handle(req, () => ({ status: 200, headers: marked, body: "x" }));
  assert.equal(first.replayed, false);
  const replay = await idem.handle(req, () => assert.fail("replayed, not run"));
  assert.equal(replay.replayed, true);
  assert.deepEqual(replay.headers, [...marked.flat(), glue.replayedHeader(), "true"]);
  // A refusal is no replay.
  const refused = await idem.handle({ ...req, body: new Uint8Array([1]) }, () => assert.fail("refused"));
  assert.equal(refused.status, 422);
  assert.equal(refused.replayed, false);
  // And no JavaScript reads the marker.
  for (const [file, text] of sources) {
    assert.doesNotMatch(code(text), /headers\[[^\]]*length\s*-\s*2\]/, `${file} reads a header by its position`);
  }
});

test("the client's states and outcomes cross as the module's enums, its outcome names as the types say", () => {
  const members = (e) => Object.keys(e);
  assert.deepEqual(members(clientSide.OutboxState), ["Created", "Sent", "Waiting", "Answered", "Processed", "Failed", "Undetermined", "Asking", "Executed", "NotExecuted"]);
  assert.deepEqual(members(clientSide.NextKind), ["Complete", "Retry", "Failed", "Undetermined", "AskStatus", "Executed", "NotExecuted"]);
  const outcomes = members(clientSide.FetchOutcome);
  const names = clientNames.outcomes;
  assert.equal(names.length, outcomes.length);
  const kebab = (name) => name.replace(/([a-z])([A-Z])/g, "$1-$2").toLowerCase();
  for (const o of outcomes) assert.equal(names[clientSide.FetchOutcome[o]], kebab(o));
  // types/client.d.ts documents exactly these outcomes.
  const types = readFileSync(join(root, "types", "client.d.ts"), "utf8");
  const result = types.slice(types.indexOf("export type IdempotentFetchResult"), types.indexOf("/** `fetch` with an Idempotency-Key"));
  const documented = [...result.matchAll(/outcome: ([^;]+);/g)].flatMap((m) => [...m[1].matchAll(/"([a-z-]+)"/g)].map((n) => n[1]));
  assert.deepEqual(documented.sort(), [...names].sort());
  // The client compares states and outcomes by enum, never by a string of its own.
  for (const [file, text] of sources.filter(([f]) => ["client.js", "client-request.js", "outbox.js", "counter.js"].includes(f))) {
    for (const name of [...names, "sent", "complete", "retry"]) {
      assert.doesNotMatch(code(text), new RegExp(`[=!]==\\s*"${name}"`), `${file} compares with "${name}"`);
    }
  }
});

test("the typings declare every member of Idempotency, and types/check.ts uses each that an adapter calls", () => {
  const types = readFileSync(join(root, "types", "index.d.ts"), "utf8");
  const start = types.indexOf("export class Idempotency<");
  const block = types.slice(start, types.indexOf("\n}\n", start));
  const declared = new Set([...block.matchAll(/^ {2}(?:readonly )?(\w+)[(<?:]/gm)].map((m) => m[1]));
  // Every public member of the class (server.js).
  const server = code(sources.find(([f]) => f === "server.js")[1]);
  const klass = server.slice(server.indexOf("export class Idempotency"));
  const members = [...klass.matchAll(/^ {2}(?:async |get )?([a-zA-Z]\w*)\(/gm)].map((m) => m[1]).filter((n) => n !== "constructor");
  assert.ok(members.length >= 15, members.join(", "));
  for (const name of members) assert.ok(declared.has(name), `types/index.d.ts does not declare Idempotency#${name}`);
  // Every member an adapter calls (the Fetch wrapper, the body reader, Express, the inbox).
  const called = new Set();
  for (const [file, text] of sources) {
    for (const [, name] of code(text).matchAll(/(?<![\w.])idem\.(\w+)/g)) {
      assert.ok(declared.has(name), `${file} calls Idempotency#${name}, which types/index.d.ts does not declare`);
      called.add(name);
    }
  }
  for (const name of ["keyHeader", "lowWaterHeader", "protects", "refuseBody", "begin", "principalOf", "serve", "handle", "mappedRefusal", "responseOf", "deliver"]) {
    assert.ok(called.has(name), `no adapter calls ${name}`);
  }
  // `npm run typecheck` compiles a use of each.
  const check = readFileSync(join(root, "types", "check.ts"), "utf8");
  for (const name of called) assert.match(check, new RegExp(`\\.${name}\\b`), `types/check.ts never uses Idempotency#${name}`);
});

test("the telemetry's names are the core's, read from the module; no JavaScript writes them; the docs list exactly them (IDEM-EVT-2)", () => {
  const t = JSON.parse(glue.telemetryNames());
  const names = [...t.spans, ...Object.values(t.attributes), ...Object.values(t.metrics)];
  assert.equal(new Set(names).size, names.length, "a name is used twice");
  assert.deepEqual(t.spans.slice(0, 2), ["idem.request", "idem.status"]);
  assert.equal(t.attributes.httpRoute, "http.route");
  assert.deepEqual(t.outcomes, ["executed", "replayed", "conflict", "mismatch", "refused", "recovered"]);
  // The decision mask and the takeover index point into the event list.
  const events = glue.eventNames().split(",");
  assert.equal(events[t.takeover], "took-over");
  const deciding = events.filter((_, i) => (glue.decisionMask() & (1 << i)) !== 0);
  assert.ok(deciding.includes("executed") && deciding.includes("duplicate") && !deciding.includes("completed"), deciding);
  assert.equal(t.outcomes[glue.operationOutcome(events.indexOf("in-progress"), 409)], "conflict");
  assert.equal(t.outcomes[glue.operationOutcome(-1, 201)], "executed");
  assert.equal(t.outcomes[glue.operationOutcome(-1, 404)], "refused");
  for (const [file, text] of sources) {
    for (const name of names) assert.ok(!code(text).includes(`"${name}"`), `${file} writes "${name}" by hand`);
  }
  // docs/observability.md: one table, one row per name, the first cell the name.
  const doc = readFileSync(join(root, "..", "docs", "observability.md"), "utf8");
  const rows = [...doc.matchAll(/^\| `([^`]+)` \|/gm)].map((m) => m[1]);
  assert.deepEqual([...rows].sort(), [...names].sort());
});

test("the client's module has one entry point: every operation JavaScript calls is the module's, and values cross both ways", () => {
  // Each operation is the module's ClientOp, named by JavaScript (the Echo operation is for
  // this test), and no JavaScript numbers one by hand.
  const ops = Object.keys(ClientOp);
  const client = sources.filter(([f]) => ["client.js", "outbox.js", "counter.js"].includes(f)).map(([, t]) => code(t)).join("\n");
  const used = new Set([...client.matchAll(/\bClientOp\.([A-Za-z0-9]+)/g)].map((m) => m[1]));
  assert.deepEqual(ops.filter((op) => !used.has(op)), ["Echo"]);
  assert.doesNotMatch(client, /\bcall\(\s*\d/, "an operation is called by number");
  // The tags of the format are the module's, each its own number.
  const tags = Object.keys(Wire);
  assert.deepEqual(tags, ["Absent", "Number", "Bytes", "Text", "Error"]);
  assert.equal(new Set(tags.map((t) => Wire[t])).size, tags.length);
  // Every kind of value reads back as the module read it: absent values, numbers (booleans
  // as 0 or 1), text in UTF-8 and bytes, empty and large.
  const large = new Uint8Array(300_000).map((_, i) => i % 251);
  const values = [undefined, null, 0, -1.5, NaN, 2 ** 53, -0, true, false, "", "café ☕ 𝄞", new Uint8Array(0), new Uint8Array([0, 255]), large];
  const expected = [undefined, undefined, 0, -1.5, NaN, 2 ** 53, -0, 1, 0, "", "café ☕ 𝄞", new Uint8Array(0), new Uint8Array([0, 255]), large];
  assert.deepEqual(outbox.run(ClientOp.Echo, ...values), expected);
  // A refusal crosses as the RangeError the module describes, with its code.
  assert.throws(() => outbox.decode(clientSide.call(ops.length, outbox.encode([]))), (e) => e instanceof RangeError && e.code === "IDEM-JS-2");
  assert.throws(() => outbox.run(ClientOp.Digest, "POST"), (e) => e instanceof RangeError && e.code === "IDEM-JS-2");
  assert.throws(() => outbox.run(ClientOp.Restore, new Uint8Array([1, 2]), undefined, undefined, undefined, undefined), (e) => e.code === "IDEM-CLIENT-6");
  // Numbers the module hands back, as the client reads them: an entry's view and its state.
  const [digest] = outbox.run(ClientOp.Digest, "POST", "http://x/o", new Uint8Array([1]));
  assert.equal(digest.length, 32);
  const entry = outbox.Outbox.create("k-1", digest, [undefined, undefined, undefined, undefined]);
  assert.deepEqual([entry.key, entry.state, entry.outcome, entry.attempts, entry.lastStatus], ["k-1", clientSide.OutboxState.Created, undefined, 0, undefined]);
  entry.send(1000, digest);
  const next = entry.onResponse(1001, 201, undefined, undefined, false);
  assert.deepEqual(next, { kind: clientSide.NextKind.Complete, outcome: clientSide.FetchOutcome.Completed, status: undefined, reason: undefined });
  assert.deepEqual([entry.state, entry.attempts, entry.lastStatus], [clientSide.OutboxState.Answered, 1, 201]);
});

test("the browsers' lean module has every operation but the counter numbering and the digest, and WebCrypto's digest of its message is the full module's", async () => {
  // A second instance of the loader, as the browsers' bundle has its own.
  const lean = await import(`${pathToFileURL(join(stage, "client-module.js"))}?lean`);
  lean.initSync({ module: readFileSync(join(root, "dist", "idem_client_lean_bg.wasm")) });
  const runLean = (op, ...args) => outbox.decode(lean.call(op, outbox.encode(args)));
  const fullOnly = ["Digest", "CounterNew", "CounterRestore", "CounterTake", "CounterDone", "CounterLowWater"];
  for (const op of fullOnly) {
    assert.throws(() => runLean(ClientOp[op]), (e) => e.code === "IDEM-JS-2" && /unknown operation/.test(e.message), op);
  }
  assert.deepEqual(runLean(ClientOp.Echo, "x", 1), ["x", 1]);
  // The digest: WebCrypto's SHA-256 of the message either module lays out, as the full
  // module hashes it (payloadDigest takes this path wherever crypto.subtle is).
  const large = new Uint8Array(100_000).map((_, i) => (i * 7) % 256);
  for (const [method, url, body] of [["POST", "http://x/o", new Uint8Array([1])], ["", "", new Uint8Array(0)], ["PUT", "https://h/é?q=1", large]]) {
    const [message] = runLean(ClientOp.PayloadMessage, method, url, body);
    assert.deepEqual(outbox.run(ClientOp.PayloadMessage, method, url, body), [message]);
    const [digest] = outbox.run(ClientOp.Digest, method, url, body);
    assert.deepEqual(new Uint8Array(await crypto.subtle.digest("SHA-256", message)), digest);
    assert.deepEqual(await outbox.payloadDigest(method, url, body), digest);
  }
});

test("the client's loader instantiates the module from each form `idem/client/manual` documents, and frees every call's input and answer", async () => {
  const bytes = readFileSync(join(root, "dist", "idem_client_bg.wasm"));
  const fresh = async (name) => import(`${pathToFileURL(join(stage, "client-module.js"))}?${name}`);
  const forms = {
    bytes: async (m) => m.initSync(bytes),
    module: async (m) => m.initSync({ module: new WebAssembly.Module(bytes) }),
    response: async (m) => m.default({ module_or_path: new Response(bytes) }),
    promise: async (m) => m.default(Promise.resolve(new Response(bytes))),
    compiled: async (m) => m.default(await WebAssembly.compile(bytes)),
    buffer: async (m) => m.default(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length)),
  };
  for (const [name, init] of Object.entries(forms)) {
    const m = await fresh(name);
    const exports = await init(m);
    assert.equal(await init(m), exports, `${name}: instantiated once`);
    assert.deepEqual(outbox.decode(m.call(ClientOp.Echo, outbox.encode(["é", 2]))), ["é", 2], name);
  }
  const failed = await fresh("failed");
  await assert.rejects(failed.default(new Response("no", { status: 404 })), /failed to fetch the client's WebAssembly module: 404/);
  // Once instantiated, init returns at once, whatever it is given: nothing is fetched again
  // (Node's fetch refuses the default file: URL, so a second fetch would reject).
  const once = await fresh("once");
  const first = once.initSync(bytes);
  assert.equal(await once.default(), first);
  assert.equal(await once.default({}), first);
  assert.equal(await once.default(new Response("not a module")), first);
  // Without a source, `init({})` and `init()` fetch the module beside the loader: in Node, a
  // file: URL that fetch refuses, which shows the default was taken (not `undefined`).
  for (const input of [undefined, {}, { module_or_path: undefined }]) {
    await assert.rejects((await fresh(`default-${JSON.stringify(input)}`)).default(input), (e) => e instanceof TypeError && !/WebAssembly/.test(e.message));
  }
  // Input and answer are freed: a hundred calls of 300 kB leave the memory at its size
  // after the first.
  const large = new Uint8Array(300_000).fill(7);
  outbox.run(ClientOp.Echo, large);
  const size = clientModule.initSync().memory.buffer.byteLength;
  for (let i = 0; i < 100; i++) outbox.run(ClientOp.Echo, large);
  assert.equal(clientModule.initSync().memory.buffer.byteLength, size);
});

test("a browser page whose full module failed to load tries again at the next operation that needs it", async () => {
  let tries = 0;
  outbox.fullModule(async () => {
    if (++tries === 1) throw new Error("offline");
    return { call: clientSide.call };
  });
  try {
    await assert.rejects(outbox.runFull(ClientOp.Echo, 1), /offline/);
    assert.deepEqual(await outbox.runFull(ClientOp.Echo, 1), [1]);
    assert.deepEqual(await outbox.runFull(ClientOp.Echo, 2), [2]);
    assert.equal(tries, 2, "loaded once, then kept");
  } finally {
    outbox.fullModule(async () => ({ call: clientSide.call }));
  }
});
