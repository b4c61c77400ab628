// What the browser tests start: the demo server (a process of its own on 127.0.0.1, on a
// port the OS chose) and Debian's Chromium, headless, driven through puppeteer-core (which
// uses the installed browser and downloads nothing). Each is stopped by its `stop()`, and a
// test stops what it started also when it fails.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import puppeteer from "puppeteer-core";

export const EXAMPLE_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..");

/** Debian's Chromium (`apt-get install chromium`), or $CHROMIUM. */
export const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";

/** A fresh directory; `removeDir` deletes it. */
export function tempDir(prefix = "idem-browser-") {
  return mkdtempSync(join(tmpdir(), prefix));
}

export function removeDir(dir) {
  rmSync(dir, { recursive: true, force: true });
}

/** Starts `node server.mjs` (with `env` added to its environment) and resolves to
 * `{ url, stop() }` once it prints its URL. */
export async function startServer(env = {}) {
  const child = spawn(process.execPath, [join(EXAMPLE_DIR, "server.mjs")], {
    cwd: EXAMPLE_DIR,
    env: { ...process.env, PORT: "0", ...env },
    stdio: ["ignore", "pipe", "pipe"],
    detached: true,
  });
  let output = "";
  // The last lines of its error output, for a failure message.
  child.stderr.on("data", (d) => (output = (output + d).slice(-2000)));
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((resolve) => child.once("exit", resolve));
    try {
      process.kill(-child.pid, "SIGTERM");
    } catch {
      // Already gone.
    }
    await exited;
  };
  try {
    const url = await new Promise((resolve, reject) => {
      let out = "";
      const timer = setTimeout(() => reject(new Error(`the server printed no URL in 10 s: ${out}${output}`)), 10_000);
      child.stdout.on("data", (d) => {
        out += d;
        const line = out.split("\n").find((l) => l.startsWith("http://"));
        if (line) {
          clearTimeout(timer);
          resolve(line.trim().replace(/\/$/, ""));
        }
      });
      child.once("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`the server exited with ${code}: ${output}`));
      });
    });
    return { url, stop, process: child };
  } catch (err) {
    await stop();
    throw err;
  }
}

/**
 * Launches headless Chromium with `userDataDir` as its profile. The flags keep it off the
 * network (no background requests, updates or sync) and run it as root in a container;
 * `args` are added to them.
 */
export function launchChromium(userDataDir, args = []) {
  return puppeteer.launch({
    executablePath: CHROMIUM,
    userDataDir,
    headless: true,
    defaultViewport: { width: 800, height: 600 },
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--disable-dev-shm-usage",
      ...args,
    ],
  });
}

/** JSON from the demo server. */
export async function getJson(url) {
  const r = await fetch(url, { signal: AbortSignal.timeout(10_000) });
  if (!r.ok) throw new Error(`GET ${url} answered ${r.status}`);
  return r.json();
}

export async function postJson(url, body) {
  const r = await fetch(url, { method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json" }, signal: AbortSignal.timeout(10_000) });
  if (!r.ok) throw new Error(`POST ${url} answered ${r.status}`);
  await r.arrayBuffer();
}

/** Polls `probe()` until it returns a value other than undefined, for at most `ms`. */
export async function until(probe, ms, what) {
  const end = Date.now() + ms;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() >= end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/**
 * Resolves once every one of `keys` is in the `localStorage` that Chromium keeps on disk in
 * profile `userDataDir` (a LevelDB under `Default/Local Storage`, where a key is written as
 * its Latin-1 bytes). Chromium writes a change there some seconds after the page made it; a
 * browser killed before that loses it.
 */
export function untilOnDisk(userDataDir, keys, ms) {
  const dir = join(userDataDir, "Default", "Local Storage", "leveldb");
  const wanted = keys.map((k) => Buffer.from(k, "latin1"));
  return until(
    () => {
      const files = (existsSync(dir) ? readdirSync(dir) : []).flatMap((f) => {
        try {
          return [readFileSync(join(dir, f))];
        } catch {
          return []; // Removed since it was listed (a compaction).
        }
      });
      return wanted.every((k) => files.some((f) => f.includes(k))) ? true : undefined;
    },
    ms,
    `${keys.join(", ")} on disk`,
  );
}
