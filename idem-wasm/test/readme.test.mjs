// The programs the READMEs open with, run as written against the packed tarball installed
// into an empty project: each block under a `<!-- readme-test: NAME -->` marker is written to
// NAME (with the port 3000 it names replaced by a free one), every `*server*.mjs` is started
// and sent one order twice, and a `client.mjs` beside it is run against it. A README whose
// program stops working fails here.
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { packAndInstall } from "./helpers.mjs";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const repo = resolve(root, "..");
const pages = ["idem-wasm/README.md", "README.md", "docs/frameworks/hono.md", "docs/frameworks/express.md"];
// What the programs import besides idem: linked from this package's own devDependencies.
const frameworks = ["hono", "@hono/node-server", "express"];

/** The JavaScript blocks of a page under `<!-- readme-test: NAME.mjs -->` markers, by name
 * (a Rust block's marker names the example it copies: idem-tower's tests/readme.rs). */
export function programs(text) {
  const found = new Map();
  const marker = /<!-- readme-test: (\S+\.mjs) -->\s*\n```[a-z]*\n([\s\S]*?)\n```/g;
  for (const [, name, code] of text.matchAll(marker)) found.set(name, `${code}\n`);
  return found;
}

/** A port nothing listens on now. */
async function freePort() {
  const server = createServer();
  await new Promise((done) => server.listen(0, "127.0.0.1", done));
  const { port } = server.address();
  await new Promise((done) => server.close(done));
  return port;
}

/** Starts `file` and resolves once it printed its address. */
function start(app, file) {
  const child = spawn(process.execPath, [file], { cwd: app, stdio: ["ignore", "pipe", "inherit"] });
  return new Promise((ready, failed) => {
    let out = "";
    child.stdout.on("data", (chunk) => {
      out += chunk;
      if (out.includes("http://")) ready(child);
    });
    child.on("exit", (code) => failed(new Error(`${file} exited with ${code} before it listened: ${out}`)));
  });
}

describe("the READMEs' first programs, as written", () => {
  let dir;
  let app;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), "idem-readme-"));
    ({ app } = packAndInstall(root, dir));
    mkdirSync(join(app, "node_modules", "@hono"), { recursive: true });
    for (const name of frameworks) symlinkSync(join(root, "node_modules", name), join(app, "node_modules", name));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  for (const page of pages) {
    const blocks = programs(readFileSync(join(repo, page), "utf8"));
    test(`${page} has a program under a readme-test marker`, () => {
      assert.ok([...blocks.keys()].some((name) => name.includes("server")), [...blocks.keys()].join(", "));
    });
    for (const [name, code] of blocks) {
      if (!name.includes("server")) continue;
      test(`${page}: ${name} replays a retried order${blocks.has("client.mjs") ? ", and client.mjs places one" : ""}`, async () => {
        const port = await freePort();
        const own = (text) => text.replaceAll("3000", String(port));
        const folder = join(app, page.replaceAll("/", "_"));
        mkdirSync(folder, { recursive: true });
        for (const [file, text] of blocks) writeFileSync(join(folder, file), own(text));
        const server = await start(folder, name);
        try {
          const order = () =>
            fetch(`http://127.0.0.1:${port}/orders`, {
              method: "POST",
              headers: { "x-account-id": "acct_1", "idempotency-key": '"order-1"', "content-type": "application/json" },
              body: '{"amount":900}',
            });
          const first = await order();
          const retry = await order();
          assert.equal(first.status, 201);
          assert.deepEqual(await first.json(), { id: 1, order: { amount: 900 } });
          assert.equal(retry.status, 201);
          assert.equal(retry.headers.get("idempotent-replayed"), "true");
          assert.deepEqual(await retry.json(), { id: 1, order: { amount: 900 } });
          if (blocks.has("client.mjs")) {
            const { stdout } = await promisify(execFile)(process.execPath, ["client.mjs"], { cwd: folder });
            assert.equal(stdout.trim(), "completed 201 { id: 2, order: { amount: 900 } }");
          }
        } finally {
          server.kill();
        }
      });
    }
  }
});
