// The worker as wrangler builds it: `wrangler deploy --dry-run` bundles it (with esbuild, as
// a deploy does) together with the WebAssembly module, and `npm run dev` (wrangler dev
// --local, workerd) serves the bundle: keys are claimed, replayed (IDEM-REPLAY-1) and kept in
// the persisted state across a restart of the dev server.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { createRequire } from "node:module";
import { EXAMPLE_DIR, count, post, removeDir, tempDir } from "./runtime.mjs";

const WRANGLER = createRequire(import.meta.url).resolve("wrangler/bin/wrangler.js");
const quiet = {
  ...process.env,
  WRANGLER_SEND_METRICS: "false",
  WRANGLER_HIDE_BANNER: "true",
  CLOUDFLARE_CF_FETCH_ENABLED: "false",
  WRANGLER_LOG_PATH: undefined,
};

/** Starts `args` in a process group of its own; `stop()` ends the whole group. */
function start(args, { cwd, env, logDir }) {
  const child = spawn(process.execPath, args, {
    cwd,
    env: { ...env, WRANGLER_LOG_PATH: logDir },
    detached: true,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  child.stdout.on("data", (c) => (output += c));
  child.stderr.on("data", (c) => (output += c));
  const exited = new Promise((resolve) => child.on("exit", resolve));
  return {
    output: () => output,
    exited,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      try {
        process.kill(-child.pid, "SIGTERM");
      } catch {
        return;
      }
      const timer = setTimeout(() => {
        try {
          process.kill(-child.pid, "SIGKILL");
        } catch {
          // already gone
        }
      }, 5000);
      await exited;
      clearTimeout(timer);
    },
  };
}

async function untilReady(proc, ms) {
  const end = Date.now() + ms;
  let exited = false;
  proc.exited.then(() => (exited = true));
  while (Date.now() < end && !exited) {
    const ready = /Ready on (http:\/\/127\.0\.0\.1:\d+)/.exec(proc.output());
    if (ready) return ready[1];
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`wrangler dev did not get ready:\n${proc.output()}`);
}

test("wrangler deploy --dry-run bundles the worker with its WebAssembly module", { timeout: 60_000 }, async () => {
  const dir = tempDir();
  const proc = start([WRANGLER, "deploy", "--dry-run", "--outdir", join(dir, "out")], { cwd: EXAMPLE_DIR, env: quiet, logDir: join(dir, "logs") });
  try {
    let timer;
    const code = await Promise.race([proc.exited, new Promise((resolve) => (timer = setTimeout(resolve, 50_000, "timeout")))]);
    clearTimeout(timer);
    assert.equal(code, 0, proc.output());
    const files = readdirSync(join(dir, "out"));
    assert.ok(files.includes("worker.js"), files.join(", "));
    const wasm = files.filter((f) => f.endsWith(".wasm"));
    assert.equal(wasm.length, 1, files.join(", "));
    assert.ok(statSync(join(dir, "out", wasm[0])).size > 10_000);
  } finally {
    await proc.stop();
    removeDir(dir);
  }
});

test("npm run dev serves the bundled worker, and its state survives a restart", { timeout: 90_000 }, async () => {
  const dir = tempDir();
  const key = `"${randomUUID()}"`;
  const devArgs = [join(EXAMPLE_DIR, "scripts/dev.mjs"), "--port", "0", "--persist-to", join(dir, "state")];
  const options = { cwd: EXAMPLE_DIR, env: process.env, logDir: join(dir, "logs") };
  try {
    let first;
    let dev = start(devArgs, options);
    try {
      const url = await untilReady(dev, 60_000);
      const r = await post(url, { key });
      assert.equal(r.status, 201, dev.output());
      first = await r.text();
      const replay = await post(url, { key });
      assert.equal(replay.headers.get("idempotent-replayed"), "true");
      assert.equal(await replay.text(), first);
      const bad = await post(url, { key: `"${"k".repeat(256)}"` });
      assert.equal(bad.status, 400);
      assert.equal(bad.headers.get("content-type"), "application/problem+json");
      await bad.arrayBuffer();
      assert.equal(await count(url), 1);
    } finally {
      await dev.stop();
    }

    dev = start(devArgs, options);
    try {
      const url = await untilReady(dev, 60_000);
      const replay = await post(url, { key });
      assert.equal(replay.status, 201);
      assert.equal(replay.headers.get("idempotent-replayed"), "true");
      assert.equal(await replay.text(), first);
      assert.equal(await count(url), 1);
    } finally {
      await dev.stop();
    }
  } finally {
    removeDir(dir);
  }
});
