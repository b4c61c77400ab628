// The packed tarball in each runtime, through the package's `exports` map: `npm pack`, then
// `npm install ./<tarball>` into an empty project, and one small program per runtime that
// answers a fresh request, its replay and a changed payload under the same key, and says
// which file `import "idem"` (or `require("idem")`) loaded. Deno and Bun are the real
// binaries of the npm packages `@deno/linux-x64-glibc` (installed in test/deno/) and `bun`.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { packAndInstall } from "./helpers.mjs";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const bin = (name) =>
  name === "deno"
    ? // test/deno/ installs the Linux x64 binary (npm ci skips it on other platforms).
      join(root, "test", "deno", "node_modules", "@deno", "linux-x64-glibc", "deno")
    : join(root, "node_modules", ".bin", name);
// Deno's first run fills its cache (kept in the temporary directory); Bun starts at once.
const TIMEOUT = 120_000;

// The three requests, the same in every runtime. `runtime` and `entry` are set before.
const REQUESTS = `
const store = new MemoryStore();
let runs = 0;
const handler = withIdempotency(async (request) => {
  runs++;
  return Response.json({ id: runs, order: await request.json() }, { status: 201 });
}, { store, principal: "none" });
const send = (body) => handler(new Request("http://127.0.0.1/orders", {
  method: "POST",
  headers: { "content-type": "application/json", "idempotency-key": '"order-1"' },
  body,
}));
const fresh = await send('{"amount":900}');
const freshBody = await fresh.text();
const replay = await send('{"amount":900}');
const replayBody = await replay.text();
const mismatch = await send('{"amount":901}');
const problem = await mismatch.json();
console.log(JSON.stringify({
  runtime,
  entry,
  runs,
  fresh: { status: fresh.status, body: freshBody },
  replay: { status: replay.status, replayed: replay.headers.get("idempotent-replayed"), body: replayBody },
  mismatch: { status: mismatch.status, contentType: mismatch.headers.get("content-type"), type: problem.type },
}));
`;
// One request through the client entry (\`idem/client\`, its own module), sent to the same
// handler by \`idempotentFetch\`'s \`fetch\` option. \`clientEntry\` is set before.
const CLIENT = `
const sent = await idempotentFetch("http://127.0.0.1/orders", {
  method: "POST",
  headers: { "content-type": "application/json" },
  body: '{"amount":700}',
}, { fetch: (input, init) => handler(new Request(input, init)) });
console.log(JSON.stringify({
  clientEntry,
  runs,
  client: { outcome: sent.outcome, status: sent.status, attempts: sent.attempts, key: sent.key, body: await sent.response.text() },
}));
`;
const RUNTIME = `const runtime = globalThis.Deno ? "deno " + Deno.version.deno : globalThis.Bun ? "bun " + Bun.version : "node " + process.versions.node;`;

const PROGRAMS = {
  "esm.mjs": `import { MemoryStore, withIdempotency } from "idem";
import { idempotentFetch } from "idem/client";
${RUNTIME}
// A bundled copy has no node_modules to resolve from.
let entry = null;
let clientEntry = null;
try {
  entry = import.meta.resolve("idem");
  clientEntry = import.meta.resolve("idem/client");
} catch {}
${REQUESTS}${CLIENT}`,
  "cjs.cjs": `const { MemoryStore, withIdempotency } = require("idem");
const { idempotentFetch } = require("idem/client");
${RUNTIME}
const entry = require.resolve("idem");
const clientEntry = require.resolve("idem/client");
(async () => {${REQUESTS}${CLIENT}})();`,
  // idem/manual: nothing is instantiated until the program calls initSync with a module it
  // compiled itself.
  "manual.mjs": `import { readFileSync } from "node:fs";
import * as idem from "idem/manual";
${RUNTIME}
const entry = import.meta.resolve("idem/manual");
let beforeInit = "constructed";
try { new idem.MemoryStore(); } catch (e) { beforeInit = e.constructor.name; }
const module = new WebAssembly.Module(readFileSync("node_modules/idem/dist/idem_wasm_bg.wasm"));
idem.initSync({ module });
const { MemoryStore, withIdempotency } = idem;
console.log(JSON.stringify({ beforeInit }));
${REQUESTS}`,
  // The same from CommonJS, where the runtime can require an ES module.
  "manual.cjs": `const { readFileSync } = require("node:fs");
const { initSync, MemoryStore, withIdempotency } = require("idem/manual");
${RUNTIME}
const entry = require.resolve("idem/manual");
initSync({ module: new WebAssembly.Module(readFileSync("node_modules/idem/dist/idem_wasm_bg.wasm")) });
(async () => {${REQUESTS}})();`,
  // idem/client/manual: the client's module is not instantiated until the program calls
  // initSync (the server's entry, loaded as usual, does not instantiate it either).
  "client-manual.mjs": `import { readFileSync } from "node:fs";
import { MemoryStore, withIdempotency } from "idem";
import * as client from "idem/client/manual";
${RUNTIME}
const entry = import.meta.resolve("idem");
const clientEntry = import.meta.resolve("idem/client/manual");
let beforeInit = "sent";
try {
  await client.idempotentFetch("http://127.0.0.1/orders", { method: "POST" }, { fetch: async () => new Response(null, { status: 201 }) });
} catch (e) {
  beforeInit = e.constructor.name;
}
client.initSync({ module: new WebAssembly.Module(readFileSync("node_modules/idem/dist/idem_client_bg.wasm")) });
const { idempotentFetch } = client;
console.log(JSON.stringify({ beforeInit }));
${REQUESTS}${CLIENT}`,
  // The same from CommonJS, where the runtime can require an ES module.
  "client-manual.cjs": `const { readFileSync } = require("node:fs");
const { MemoryStore, withIdempotency } = require("idem");
const { initSync, idempotentFetch } = require("idem/client/manual");
${RUNTIME}
const entry = require.resolve("idem");
const clientEntry = require.resolve("idem/client/manual");
initSync({ module: new WebAssembly.Module(readFileSync("node_modules/idem/dist/idem_client_bg.wasm")) });
(async () => {${REQUESTS}${CLIENT}})();`,
  // Loads one file and reports whether it initialised (for the edge-light control).
  "load.mjs": `try {
  await import(process.argv[2]);
  console.log(JSON.stringify({ loaded: true }));
} catch (e) {
  console.log(JSON.stringify({ loaded: false, error: String(e?.message ?? e) }));
}`,
  // What a Next.js / Vercel Edge bundle gives the edge-light entry, simulated in Node: the
  // `.wasm?module` import is a WebAssembly.Module compiled ahead (by the bundler, at build
  // time), and the program itself may not compile WebAssembly from bytes (WebAssembly.compile,
  // instantiate or instantiateStreaming with bytes, new WebAssembly.Module), as the Edge
  // Runtime refuses. Fetching a file: URL succeeds (as a deployment would serve the file),
  // so that only the compilation is refused.
  "edge/preload.mjs": `import { register } from "node:module";
import { readFileSync } from "node:fs";
// Node's Fetch implementation compiles its own HTTP parser when it loads: load it before
// the rules apply.
void new Response("");
const realFetch = globalThis.fetch;
const { Module, instantiate } = WebAssembly;
globalThis[Symbol.for("idem.test.precompiled")] = (url) => new Module(readFileSync(new URL(url)));
register("./hooks.mjs", import.meta.url);
const refuse = (what) => new EvalError(what + ": code generation from WebAssembly bytes is not allowed here");
function RefusingModule() { throw refuse("new WebAssembly.Module"); }
RefusingModule.prototype = Module.prototype;
WebAssembly.Module = RefusingModule;
WebAssembly.compile = async () => { throw refuse("WebAssembly.compile"); };
WebAssembly.compileStreaming = async () => { throw refuse("WebAssembly.compileStreaming"); };
WebAssembly.instantiateStreaming = async () => { throw refuse("WebAssembly.instantiateStreaming"); };
WebAssembly.instantiate = (source, imports) =>
  source instanceof Module ? instantiate(source, imports) : Promise.reject(refuse("WebAssembly.instantiate with bytes"));
globalThis.fetch = async (input, init) => {
  const url = new URL(input instanceof Request ? input.url : String(input));
  if (url.protocol !== "file:") return realFetch(input, init);
  return new Response(readFileSync(url), { headers: { "content-type": "application/wasm" } });
};`,
  "edge/hooks.mjs": `export async function resolve(specifier, context, next) {
  if (specifier.endsWith(".wasm?module")) return { url: new URL(specifier, context.parentURL).href, shortCircuit: true };
  return next(specifier, context);
}
export async function load(url, context, next) {
  if (!url.endsWith(".wasm?module")) return next(url, context);
  const file = JSON.stringify(url.slice(0, -"?module".length));
  return {
    format: "module",
    source: "export default globalThis[Symbol.for('idem.test.precompiled')](" + file + ");",
    shortCircuit: true,
  };
}`,
  // The types each kind of TypeScript consumer gets through the exports map.
  "types/esm.mts": `import { MemoryStore, withIdempotency } from "idem";
import init, { initSync, withIdempotency as manualWithIdempotency } from "idem/manual";
import { idempotentFetch, type IdempotentFetchResult } from "idem/client";
import { initSync as initClient } from "idem/client/manual";
const store: MemoryStore = new MemoryStore();
void initClient;
const sent: Promise<IdempotentFetchResult> = idempotentFetch("https://api.example/orders", { method: "POST" }, { keyVersion: 7 });
void sent;
const handler: (request: Request) => Promise<Response> = withIdempotency(() => new Response(null), { store, principal: "none" });
initSync({ module: new Uint8Array(8) });
void init;
void manualWithIdempotency;
void handler;
`,
  "types/cjs.cts": `import idem = require("idem");
import client = require("idem/client");
const sent: Promise<client.IdempotentFetchResult> = client.idempotentFetch("https://api.example/orders");
void sent;
const store: idem.MemoryStore = new idem.MemoryStore();
const handler: (request: Request) => Promise<Response> = idem.withIdempotency(() => new Response(null), { store, principal: "none" });
void handler;
`,
  "types/tsconfig.json": JSON.stringify({
    compilerOptions: {
      strict: true,
      noEmit: true,
      target: "es2022",
      module: "nodenext",
      moduleResolution: "nodenext",
      lib: ["es2022", "dom"],
      types: [],
    },
    files: ["esm.mts", "cjs.cts"],
  }),
};

/** Runs a program and returns the JSON object on each line it printed. */
function runJson(cmd, args, { cwd, env = process.env } = {}) {
  let out;
  try {
    out = execFileSync(cmd, args, { cwd, env, encoding: "utf8", timeout: TIMEOUT, stdio: ["ignore", "pipe", "pipe"] });
  } catch (e) {
    assert.fail(`${cmd} ${args.join(" ")} failed (${e.status ?? e.signal}):\n${e.stdout ?? ""}\n${e.stderr ?? ""}`);
  }
  return out
    .trim()
    .split("\n")
    .map((line) => JSON.parse(line));
}

/** The three answers every program must give. */
function assertAnswers(out) {
  assert.equal(out.runs, 1, "the handler ran once, for the fresh request");
  assert.equal(out.fresh.status, 201);
  assert.deepEqual(JSON.parse(out.fresh.body), { id: 1, order: { amount: 900 } });
  assert.equal(out.replay.status, 201, "the replay has the stored status");
  assert.equal(out.replay.replayed, "true");
  assert.equal(out.replay.body, out.fresh.body, "the replay has the stored body");
  assert.equal(out.mismatch.status, 422);
  assert.match(out.mismatch.contentType, /^application\/problem\+json/);
  assert.match(out.mismatch.type, /key-reuse-mismatch/);
}

/** The client's request: sent once with a generated key, and run by the handler (its second
 * run, after the server's fresh request). */
function assertClient(out) {
  assert.equal(out.runs, 2, "the client's request ran the handler once");
  assert.equal(out.client.outcome, "completed");
  assert.equal(out.client.status, 201);
  assert.equal(out.client.attempts, 1);
  assert.match(out.client.key, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.deepEqual(JSON.parse(out.client.body), { id: 2, order: { amount: 700 } });
}

const distFile = (name) => new RegExp(`/node_modules/idem/dist/${name.replace(".", "\\.")}$`);

describe("the packed tarball in Node, Deno and Bun, through the exports map", () => {
  let dir;
  let app;
  const denoEnv = () => ({
    ...process.env,
    DENO_DIR: join(dir, "deno-cache"),
    DENO_NO_UPDATE_CHECK: "1",
    NO_COLOR: "1",
  });
  const bunEnv = () => ({ ...process.env, DO_NOT_TRACK: "1", NO_COLOR: "1" });

  before(() => {
    for (const tool of ["deno", "bun", "tsc"]) {
      assert.ok(existsSync(bin(tool)), `${bin(tool)} is missing: run \`cargo xtask setup\` (npm ci in idem-wasm and idem-wasm/test/deno)`);
    }
    dir = mkdtempSync(join(tmpdir(), "idem-runtimes-"));
    ({ app } = packAndInstall(root, dir));
    for (const [name, text] of Object.entries(PROGRAMS)) {
      mkdirSync(dirname(join(app, name)), { recursive: true });
      writeFileSync(join(app, name), text);
    }
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  test("Node, ESM: the node + import entry, dist/node.js", { timeout: TIMEOUT }, () => {
    const [out, sent] = runJson(process.execPath, ["esm.mjs"], { cwd: app });
    assert.match(out.runtime, /^node /);
    assert.match(out.entry, distFile("node.js"));
    assertAnswers(out);
    assert.match(sent.clientEntry, distFile("client-node.js"));
    assertClient(sent);
  });

  test("Node, CommonJS: the node + require entry, dist/node.cjs", { timeout: TIMEOUT }, () => {
    const [out, sent] = runJson(process.execPath, ["cjs.cjs"], { cwd: app });
    assert.match(out.entry, distFile("node.cjs"));
    assertAnswers(out);
    assert.match(sent.clientEntry, distFile("client.cjs"));
    assertClient(sent);
  });

  test("Deno (deno run -A): the deno entry, dist/deno.js", { timeout: TIMEOUT }, () => {
    const [out, sent] = runJson(bin("deno"), ["run", "-A", "esm.mjs"], { cwd: app, env: denoEnv() });
    assert.match(out.runtime, /^deno 2\./);
    assert.match(out.entry, distFile("deno.js"));
    assertAnswers(out);
    assert.match(sent.clientEntry, distFile("client-deno.js"));
    assertClient(sent);
  });

  test("Deno without any permission: the module is imported, not read from disk", { timeout: TIMEOUT }, () => {
    const [out, sent] = runJson(bin("deno"), ["run", "--no-prompt", "esm.mjs"], { cwd: app, env: denoEnv() });
    assert.match(out.entry, distFile("deno.js"));
    assertAnswers(out);
    assertClient(sent);
  });

  test("Deno, CommonJS: require() takes node + require, dist/node.cjs (it reads the file)", { timeout: TIMEOUT }, () => {
    const [out, sent] = runJson(bin("deno"), ["run", "-A", "cjs.cjs"], { cwd: app, env: denoEnv() });
    assert.match(out.entry, distFile("node.cjs"));
    assertAnswers(out);
    assert.match(sent.clientEntry, distFile("client.cjs"));
    assertClient(sent);
  });

  test("Bun, ESM: the bun entry, dist/bun.js", { timeout: TIMEOUT }, () => {
    const [out, sent] = runJson(bin("bun"), ["esm.mjs"], { cwd: app, env: bunEnv() });
    assert.match(out.runtime, /^bun 1\./);
    assert.match(out.entry, distFile("bun.js"));
    assertAnswers(out);
    assert.match(sent.clientEntry, distFile("client-bun.js"));
    assertClient(sent);
  });

  test("Bun, CommonJS: require() gets the same bun entry", { timeout: TIMEOUT }, () => {
    const [out, sent] = runJson(bin("bun"), ["cjs.cjs"], { cwd: app, env: bunEnv() });
    assert.match(out.entry, distFile("bun.js"));
    assertAnswers(out);
    assert.match(sent.clientEntry, distFile("client-bun.js"));
    assertClient(sent);
  });

  test("Bun, bundled: bun build carries the module beside the bundle", { timeout: TIMEOUT }, () => {
    const out = join(dir, "bun-bundle");
    execFileSync(bin("bun"), ["build", "--target=bun", "--outdir", out, "esm.mjs"], {
      cwd: app,
      env: bunEnv(),
      stdio: "ignore",
      timeout: TIMEOUT,
    });
    assert.match(readFileSync(join(out, "esm.js"), "utf8"), /node_modules\/idem\/dist\/bun\.js/);
    assert.ok(readdirSync(out).some((f) => /^idem_wasm_bg.*\.wasm$/.test(f)), "the module is copied next to the bundle");
    assert.ok(readdirSync(out).some((f) => /^idem_client_bg.*\.wasm$/.test(f)), "and the client's");
    // Run from elsewhere, with no node_modules in reach.
    const [answers, sent] = runJson(bin("bun"), [join(out, "esm.js")], { cwd: dir, env: bunEnv() });
    assert.equal(answers.entry, null);
    assertAnswers(answers);
    assertClient(sent);
  });

  test("Bun, compiled: bun build --compile embeds the module in the executable", { timeout: TIMEOUT }, () => {
    const exe = join(dir, "bun-compiled", "app");
    execFileSync(bin("bun"), ["build", "--compile", "--outfile", exe, "esm.mjs"], {
      cwd: app,
      env: bunEnv(),
      stdio: "ignore",
      timeout: TIMEOUT,
    });
    const [answers, sent] = runJson(exe, [], { cwd: dir, env: bunEnv() });
    assertAnswers(answers);
    assertClient(sent);
  });

  test("edge-light (simulated in Node): a module compiled ahead, no compilation at run time", { timeout: TIMEOUT }, () => {
    const edge = ["--import", "./edge/preload.mjs", "--conditions=edge-light"];
    const [out, sent] = runJson(process.execPath, [...edge, "esm.mjs"], { cwd: app });
    assert.match(out.entry, distFile("edge-light.js"));
    assertAnswers(out);
    assert.match(sent.clientEntry, distFile("client-edge-light.js"));
    assertClient(sent);
    // The control: under the same rules, the entry that edge-light runtimes would otherwise
    // get (`default`, dist/web.js) cannot start, and neither can the Node entry.
    for (const file of ["web.js", "node.js"]) {
      const [control] = runJson(process.execPath, [...edge, "load.mjs", `./node_modules/idem/dist/${file}`], { cwd: app });
      assert.equal(control.loaded, false, `${file} loaded under the edge rules`);
      assert.match(control.error, /code generation from WebAssembly bytes is not allowed/);
    }
  });

  test("idem/manual: nothing instantiated until the host calls initSync with its own module", { timeout: TIMEOUT }, () => {
    const [before, out] = runJson(process.execPath, ["manual.mjs"], { cwd: app });
    assert.equal(before.beforeInit, "TypeError", "the API needs the module: it was not instantiated on import");
    assert.match(out.entry, distFile("idem_wasm.js"));
    assertAnswers(out);
  });

  test("idem/manual and idem/client/manual from require(): Node, Deno and Bun load the ES modules", { timeout: TIMEOUT }, () => {
    for (const [cmd, run, env] of [
      [process.execPath, [], process.env],
      [bin("deno"), ["run", "-A"], denoEnv()],
      [bin("bun"), [], bunEnv()],
    ]) {
      const [out] = runJson(cmd, [...run, "manual.cjs"], { cwd: app, env });
      assert.match(out.entry, distFile("idem_wasm.js"), out.runtime);
      assertAnswers(out);
      const [served, sent] = runJson(cmd, [...run, "client-manual.cjs"], { cwd: app, env });
      assertAnswers(served);
      assert.match(sent.clientEntry, distFile("idem_client.js"), served.runtime);
      assertClient(sent);
    }
  });

  test("idem/client/manual: the client's module instantiated by the host", { timeout: TIMEOUT }, () => {
    const [before, out, sent] = runJson(process.execPath, ["client-manual.mjs"], { cwd: app });
    assert.equal(before.beforeInit, "TypeError", "the client needs its module: it was not instantiated on import");
    assertAnswers(out);
    assert.match(sent.clientEntry, distFile("idem_client.js"));
    assertClient(sent);
  });

  test("TypeScript consumers: ESM gets index.d.ts, client.d.ts and manual.d.ts, CommonJS the .d.cts", { timeout: TIMEOUT }, () => {
    let explained;
    try {
      explained = execFileSync(bin("tsc"), ["-p", "types/tsconfig.json", "--explainFiles"], {
        cwd: app,
        encoding: "utf8",
        timeout: TIMEOUT,
      });
    } catch (e) {
      assert.fail(`tsc failed:\n${e.stdout}${e.stderr}`);
    }
    const loaded = (file) => new RegExp(`^node_modules/idem/dist/${file.replaceAll(".", "\\.")}$`, "m");
    assert.match(explained, loaded("index.d.ts"));
    assert.match(explained, loaded("index.d.cts"));
    assert.match(explained, loaded("manual.d.ts"));
    assert.match(explained, loaded("client.d.ts"));
    assert.match(explained, loaded("client.d.cts"));
    assert.match(explained, loaded("client-manual.d.ts"));
  });
});
