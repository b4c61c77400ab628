// Test helpers: a loopback HTTP server for Fetch handlers, a manual clock, a barrier, and an
// in-memory fake of the Durable Object storage and namespace APIs.
import { createServer } from "node:http";

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

/** The subset of Durable Object storage the shard uses, in memory. Every call resolves on a
 * later turn of the event loop, so concurrent requests really interleave at each await. */
export class FakeStorage {
  map = new Map();
  alarm = null;
  ops = 0;
  async get(key) {
    this.ops++;
    await tick();
    return structuredClone(this.map.get(key));
  }
  async put(entries, value) {
    this.ops++;
    const batch = typeof entries === "string" ? { [entries]: value } : entries;
    for (const [k, v] of Object.entries(batch)) this.map.set(k, structuredClone(v));
    await tick();
  }
  async delete(key) {
    this.ops++;
    const had = this.map.delete(key);
    await tick();
    return had;
  }
  async list({ start = "", end = "\uffff", prefix = "", limit = Infinity } = {}) {
    this.ops++;
    await tick();
    const keys = [...this.map.keys()].filter((k) => k >= start && k < end && k.startsWith(prefix)).sort();
    return new Map(keys.slice(0, limit).map((k) => [k, structuredClone(this.map.get(k))]));
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
  constructor(Class) {
    this.Class = Class;
  }
  idFromName(name) {
    return { name };
  }
  get(id) {
    let entry = this.objects.get(id.name);
    if (entry === undefined) {
      const storage = new FakeStorage();
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
