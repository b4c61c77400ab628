// Test helpers: a loopback HTTP server for Fetch handlers, a manual clock, a barrier, and an
// in-memory fake of the Durable Object storage and namespace APIs.
import { execFileSync } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { join } from "node:path";

/** Serves a Fetch handler on 127.0.0.1 with an OS-chosen port. */
export async function serve(handler) {
  const server = createServer(async (req, res) => {
    try {
      const chunks = [];
      for await (const c of req) chunks.push(c);
      const body = chunks.length ? Buffer.concat(chunks) : undefined;
      const headers = new Headers();
      for (let i = 0; i < req.rawHeaders.length; i += 2) headers.append(req.rawHeaders[i], req.rawHeaders[i + 1]);
      const request = new Request(`http://127.0.0.1${req.url}`, {
        method: req.method,
        headers,
        body: req.method === "GET" || req.method === "HEAD" ? undefined : body,
      });
      const response = await handler(request, { req, res });
      if (response === null) return; // the handler answered (or dropped) the socket itself
      const out = Buffer.from(await response.arrayBuffer());
      res.writeHead(response.status, [...response.headers].flat());
      res.end(out);
    } catch (err) {
      res.writeHead(500, { "content-type": "text/plain" });
      res.end(String(err?.message ?? err));
    }
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(resolve);
      }),
  };
}

/** A clock the test moves by hand. */
export function manualClock(start = 1_700_000_000_000) {
  let t = start;
  const now = () => t;
  now.advance = (ms) => {
    t += ms;
  };
  now.set = (ms) => {
    t = ms;
  };
  return now;
}

/** A POST of an order with `key` and a JSON `body`, as a client sends it. */
export function postOrder(key, body = { amount: 1 }) {
  return new Request("https://api.example/orders", {
    method: "POST",
    headers: { "idempotency-key": key, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
}

/** Releases every waiter at once when `open()` is called. */
export function barrier() {
  let open;
  const promise = new Promise((resolve) => {
    open = resolve;
  });
  return { wait: () => promise, open: () => open() };
}

/** A deferred promise. */
export function deferred() {
  let resolve;
  let reject;
  const promise = new Promise((a, b) => {
    resolve = a;
    reject = b;
  });
  return { promise, resolve, reject };
}

export const tick = () => new Promise((resolve) => setImmediate(resolve));

/** The subset of Durable Object storage the shard uses, in memory.
 *
 * It interleaves like a real storage: a read takes its snapshot when it is called and its
 * answer arrives on a later turn of the event loop, and reads issued in the same turn settle
 * together, so two requests that both read before either writes both see the old value.
 * It enforces the platform's limits: at most 128 keys per call, and per value either 128 KiB
 * (`backend: "kv"`, the key-value backend) or 2 MB for key and value together
 * (`backend: "sqlite"`, the default). As in workerd, `kv.get` answers at once on the SQLite
 * backend and throws on the key-value one. */
/** The bytes a stored value takes, near enough. */
const sizeOf = (value) => (value instanceof Uint8Array ? value.byteLength : JSON.stringify(value, (_, v) => (v instanceof Uint8Array ? "x".repeat(v.byteLength) : v)).length);

export class FakeStorage {
  map = new Map();
  alarm = null;
  ops = 0;
  constructor({ backend = "sqlite" } = {}) {
    this.backend = backend;
    // workerd's synchronous API is on every object; only a SQLite-backed one answers it.
    this.kv = {
      get: (key) => {
        if (this.backend !== "sqlite") {
          throw new Error("The storage.kv (synchronous KV) API is only available for SQLite-backed Durable Objects");
        }
        this.ops++;
        return structuredClone(this.map.get(key));
      },
    };
  }
  #check(key, value) {
    const size = sizeOf(value);
    if (this.backend === "kv" && size > 128 * 1024) throw new RangeError(`Values cannot be larger than 131072 bytes (${key}: ${size})`);
    if (this.backend === "sqlite" && key.length + size > 2 * 1024 * 1024) throw new RangeError(`Key and value together cannot exceed 2 MB (${key})`);
  }
  async get(key) {
    this.ops++;
    // The snapshot is taken now; the answer arrives later.
    const value = Array.isArray(key) ? new Map(key.filter((k) => this.map.has(k)).map((k) => [k, structuredClone(this.map.get(k))])) : structuredClone(this.map.get(key));
    await tick();
    return value;
  }
  async put(entries, value) {
    this.ops++;
    const batch = typeof entries === "string" ? { [entries]: value } : entries;
    const pairs = Object.entries(batch);
    if (pairs.length > 128) throw new RangeError("put() takes at most 128 keys");
    for (const [k, v] of pairs) this.#check(k, v);
    // workerd's SQLite-backed storage refuses a put of about 2.2 MB in all.
    if (this.backend === "sqlite" && pairs.reduce((n, [k, v]) => n + k.length + sizeOf(v), 0) > 2_150_000) {
      throw new RangeError("string or blob too big: SQLITE_TOOBIG");
    }
    for (const [k, v] of pairs) this.map.set(k, structuredClone(v));
    await tick();
  }
  async delete(key) {
    this.ops++;
    const keys = Array.isArray(key) ? key : [key];
    if (keys.length > 128) throw new RangeError("delete() takes at most 128 keys");
    let n = 0;
    for (const k of keys) if (this.map.delete(k)) n++;
    await tick();
    return Array.isArray(key) ? n : n === 1;
  }
  async list({ start = "", end = "\uffff", prefix = "", limit = Infinity } = {}) {
    this.ops++;
    const keys = [...this.map.keys()].filter((k) => k >= start && k < end && k.startsWith(prefix)).sort();
    const out = new Map(keys.slice(0, limit).map((k) => [k, structuredClone(this.map.get(k))]));
    await tick();
    return out;
  }
  async getAlarm() {
    await tick();
    return this.alarm;
  }
  async deleteAlarm() {
    this.alarm = null;
    await tick();
  }
  async setAlarm(t) {
    this.alarm = t;
    await tick();
  }
}

/** A namespace of Durable Objects of one class, each with its own FakeStorage. */
export class FakeNamespace {
  objects = new Map();
  constructor(Class, storage = {}) {
    this.Class = Class;
    this.storageOptions = storage;
  }
  idFromName(name) {
    return { name };
  }
  get(id) {
    let entry = this.objects.get(id.name);
    if (entry === undefined) {
      const storage = new FakeStorage(this.storageOptions);
      entry = { storage, object: new this.Class({ storage }, {}) };
      this.objects.set(id.name, entry);
    }
    const object = entry.object;
    return { fetch: (input, init) => object.fetch(new Request(input, init)) };
  }
  /** Restarts every object (memory lost, storage kept), as an eviction would. */
  restart() {
    for (const entry of this.objects.values()) entry.object = new this.Class({ storage: entry.storage }, {});
  }
}

/** npm, quiet (no update notice, funding or audit lines), in `cwd`; its output. */
export function npm(args, cwd) {
  const env = {
    ...process.env,
    npm_config_update_notifier: "false",
    npm_config_fund: "false",
    npm_config_audit: "false",
    npm_config_loglevel: "error",
  };
  return execFileSync("npm", args, { cwd, env, encoding: "utf8" });
}

/** The package as users get it: `npm pack` of `root` into `dir` (which runs the prepack
 * check), then the tarball installed offline into the empty project `dir/app`. Returns
 * `{ tarball, app }`. */
export function packAndInstall(root, dir) {
  const packed = JSON.parse(npm(["pack", "--json", "--pack-destination", dir], root));
  const tarball = join(dir, packed[0].filename);
  const app = join(dir, "app");
  mkdirSync(app);
  // The package.json also tells Deno to resolve bare names from node_modules.
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", private: true }));
  // No dependencies to fetch: the package is self-contained.
  npm(["install", "--offline", "--no-package-lock", tarball], app);
  return { tarball, app };
}
