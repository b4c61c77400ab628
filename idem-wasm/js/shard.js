// The Durable Object store: `IdempotencyShard`, a Durable Object class that owns a shard of
// keys, and `DurableObjectStore`, the store a worker passes to `withIdempotency`.
//
// Claims are made inside the object, next to its storage: the worker sends the attempt
// (record key and fingerprint, encoded by the engine), and the object reads the record,
// asks the engine, and makes the conditional write before it awaits anything else
// (IDEM-JS-3). Requests to one object interleave at every await on other I/O, so the object
// keeps the records it has read in memory and decides from that copy synchronously: a claim
// that waited for a storage read re-reads the copy afterwards, so two claims can never both
// see "absent". Completions come back as compare-and-set writes. Alarms, set from each
// record's deadline, drive expiry (IDEM-TTL-4).
//
// Why not Workers KV: KV is eventually consistent. A write can take 60 s or more to reach
// other locations, and even "not found" answers are cached, so two requests with one key in
// two places would both see no record and both run. Claims need one serialised writer per
// key, which is what a Durable Object is.
import { expire } from "./idem_wasm.js";
import { createEngine } from "./server.js";
import { rangeError, readWrite } from "./util.js";

const RECORD = "r:";
const DEADLINE = "d:";
const CACHE_LIMIT = 10_000;
const BASE = "https://idem-shard.invalid";

function deadlineKey(deadline, key) {
  return `${DEADLINE}${String(deadline).padStart(16, "0")}:${key}`;
}

/** FNV-1a over the key's UTF-16 code units: a stable shard index. */
function shardOf(key, shards) {
  let h = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) {
    h ^= key.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h % shards;
}

/**
 * A Durable Object class that owns a shard of idempotency records. Export it from the
 * worker and bind it (`[[durable_objects.bindings]] class_name = "IdempotencyShard"`); the
 * worker talks to it through `DurableObjectStore`. The methods `claim`, `apply`, `load` and
 * `alarm` can also be called directly (from a subclass that adds RPC, or from tests).
 */
export class IdempotencyShard {
  #storage;
  #cache = new Map();
  #engines = new Map();
  #alarm = undefined;

  constructor(state, _env) {
    this.#storage = state.storage;
  }

  /** The object's HTTP face for `DurableObjectStore`. */
  async fetch(request) {
    const url = new URL(request.url);
    const h = request.headers;
    try {
      if (url.pathname === "/claim") {
        const body = new Uint8Array(await request.arrayBuffer());
        const [hi, lo] = (h.get("x-idem-nonce") ?? "0.0").split(".").map(Number);
        const out = await this.claim(body, decodeURIComponent(h.get("x-idem-options") ?? "{}"), Number(h.get("x-idem-now")), hi, lo);
        return new Response(out, { headers: { "content-type": "application/octet-stream" } });
      }
      const key = decodeURIComponent(h.get("x-idem-key") ?? "");
      if (url.pathname === "/apply") {
        const body = new Uint8Array(await request.arrayBuffer());
        const write = {
          expect: h.get("x-idem-expect"),
          value: h.get("x-idem-delete") === "1" ? null : body,
          version: h.get("x-idem-version") ?? "",
          deadline: Number(h.get("x-idem-deadline") ?? 0),
        };
        const ok = await this.apply(key, write, Number(h.get("x-idem-now")));
        return new Response(ok ? "applied" : "conflict");
      }
      if (url.pathname === "/load") {
        const r = await this.load(key);
        if (r === null) return new Response(null, { status: 404 });
        return new Response(r.value, { headers: { "x-idem-version": r.version } });
      }
      return new Response("not found", { status: 404 });
    } catch (err) {
      return new Response(String(err?.message ?? err), { status: err?.code ? 400 : 500, headers: { "x-idem-code": err?.code ?? "" } });
    }
  }

  #engine(optionsText) {
    let engine = this.#engines.get(optionsText);
    if (engine === undefined) {
      let options;
      try {
        options = JSON.parse(optionsText);
      } catch {
        throw rangeError("IDEM-JS-1", "invalid options text");
      }
      engine = createEngine(options ?? {});
      if (this.#engines.size >= 8) this.#engines.clear();
      this.#engines.set(optionsText, engine);
    }
    return engine;
  }

  /** The record for `key` as this object last saw it; after an await on storage, the copy
   * in memory wins, since another claim may have written it meanwhile. */
  async #read(key) {
    let entry = this.#cache.get(key);
    if (entry !== undefined) return entry;
    const stored = await this.#storage.get(RECORD + key);
    entry = this.#cache.get(key);
    if (entry !== undefined) return entry;
    entry = stored ?? null;
    if (this.#cache.size >= CACHE_LIMIT) this.#cache.delete(this.#cache.keys().next().value);
    this.#cache.set(key, entry);
    return entry;
  }

  /** The compare-and-set, synchronously against the copy in memory, then to storage. */
  #write(key, current, write) {
    const holds = write.expect === null ? current === null : current !== null && current.version === write.expect;
    if (!holds) return null;
    const ops = [];
    if (current !== null && current.deadline > 0 && (write.value === null || current.deadline !== write.deadline)) {
      ops.push(this.#storage.delete(deadlineKey(current.deadline, key)));
    }
    if (write.value === null) {
      this.#cache.set(key, null);
      ops.push(this.#storage.delete(RECORD + key));
    } else {
      const entry = { version: write.version, value: write.value, deadline: write.deadline };
      this.#cache.set(key, entry);
      const batch = { [RECORD + key]: entry };
      if (write.deadline > 0) batch[deadlineKey(write.deadline, key)] = write.version;
      ops.push(this.#storage.put(batch));
    }
    return ops;
  }

  async #schedule(deadline) {
    if (!(deadline > 0)) return;
    if (this.#alarm === undefined) this.#alarm = (await this.#storage.getAlarm()) ?? null;
    if (this.#alarm === null || deadline < this.#alarm) {
      this.#alarm = deadline;
      await this.#storage.setAlarm(deadline);
    }
  }

  /** Reads, decides and claims in one step; returns the engine's claim for the worker. */
  async claim(attemptBytes, optionsText, now, hi, lo) {
    const engine = this.#engine(optionsText);
    const slot = engine.beginEncoded(attemptBytes);
    try {
      const key = engine.storageKey(slot);
      const current = await this.#read(key);
      // From here to the write nothing is awaited: the claim is atomic.
      const code = engine.decide(slot, now, hi >>> 0, lo >>> 0, current?.value);
      let ops = null;
      let deadline = 0;
      if ((code & 7) === 0) {
        const write = readWrite(engine.takeWrite());
        ops = this.#write(key, current, write);
        if (ops === null) throw new Error("claim write lost against the copy in memory");
        deadline = write.deadline;
      }
      const out = engine.encodeClaim(slot);
      if (ops !== null) {
        await Promise.all(ops);
        await this.#schedule(deadline);
      }
      return out;
    } finally {
      engine.end(slot);
    }
  }

  /** Applies a compare-and-set write from a worker (a completion or a heartbeat). */
  async apply(key, write, _now) {
    const current = await this.#read(key);
    const ops = this.#write(key, current, write);
    if (ops === null) return false;
    await Promise.all(ops);
    await this.#schedule(write.value === null ? 0 : write.deadline);
    return true;
  }

  /** The stored record, `{ version, value }`, or null. */
  async load(key) {
    const entry = await this.#read(key);
    return entry === null ? null : { version: entry.version, value: entry.value };
  }

  /** Expires every record that is due, then sets the alarm for the next deadline. */
  async alarm() {
    const now = Date.now();
    const due = await this.#storage.list({ start: DEADLINE, end: deadlineKey(now + 1, ""), limit: 256 });
    for (const [indexKey, version] of due) {
      const key = indexKey.slice(DEADLINE.length + 17);
      const current = await this.#read(key);
      if (current === null || current.version !== version) {
        await this.#storage.delete(indexKey);
        continue;
      }
      const bytes = expire(now, current.value);
      if (bytes === undefined) continue;
      const write = readWrite(bytes);
      write.expect = current.version;
      const ops = this.#write(key, current, write);
      if (ops !== null) await Promise.all(ops);
    }
    const next = await this.#storage.list({ start: DEADLINE, end: DEADLINE + "\uffff", limit: 1 });
    this.#alarm = null;
    if (next.size === 0) await this.#storage.deleteAlarm();
    for (const [indexKey] of next) {
      const deadline = Number(indexKey.slice(DEADLINE.length, DEADLINE.length + 16));
      this.#alarm = Math.max(deadline, now + 1);
      await this.#storage.setAlarm(this.#alarm);
    }
  }
}

/**
 * The store a worker passes to `withIdempotency`: each key belongs to one of `shards`
 * `IdempotencyShard` objects (by name, `${prefix}${n}`), which makes its claims.
 */
export class DurableObjectStore {
  #namespace;
  #shards;
  #prefix;

  constructor(namespace, { shards = 16, prefix = "idem-shard-" } = {}) {
    if (namespace == null || typeof namespace.idFromName !== "function" || typeof namespace.get !== "function") {
      throw rangeError("IDEM-JS-1", "DurableObjectStore needs a Durable Object namespace binding");
    }
    if (!(Number.isInteger(shards) && shards > 0)) throw rangeError("IDEM-JS-1", "shards must be a positive integer");
    this.#namespace = namespace;
    this.#shards = shards;
    this.#prefix = prefix;
  }

  #stub(key) {
    return this.#namespace.get(this.#namespace.idFromName(this.#prefix + shardOf(key, this.#shards)));
  }

  async #call(key, path, headers, body) {
    const response = await this.#stub(key).fetch(`${BASE}${path}`, { method: "POST", headers, body });
    if (!response.ok && response.status !== 404) {
      const message = await response.text();
      const err = new Error(`idempotency shard: ${message}`);
      err.code = response.headers.get("x-idem-code") || "IDEM-STORE-4";
      throw err;
    }
    return response;
  }

  async claim(key, attemptBytes, optionsText, now, hi, lo) {
    const response = await this.#call(
      key,
      "/claim",
      { "x-idem-options": encodeURIComponent(optionsText), "x-idem-now": String(now), "x-idem-nonce": `${hi}.${lo}` },
      attemptBytes,
    );
    return new Uint8Array(await response.arrayBuffer());
  }

  async load(key) {
    const response = await this.#call(key, "/load", { "x-idem-key": encodeURIComponent(key) });
    if (response.status === 404) return null;
    return { version: response.headers.get("x-idem-version"), value: new Uint8Array(await response.arrayBuffer()) };
  }

  async apply(key, write, now) {
    const headers = {
      "x-idem-key": encodeURIComponent(key),
      "x-idem-version": write.version,
      "x-idem-deadline": String(write.deadline),
      "x-idem-now": String(now),
    };
    if (write.expect !== null) headers["x-idem-expect"] = write.expect;
    if (write.value === null) headers["x-idem-delete"] = "1";
    const response = await this.#call(key, "/apply", headers, write.value ?? undefined);
    return (await response.text()) === "applied";
  }
}
