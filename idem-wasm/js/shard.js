// `IdempotencyShard`, a Durable Object class that owns a shard of keys: their records in its
// storage, the claims made next to them, and the alarms that expire them.
//
// Claims are made inside the object, next to its storage: the worker sends the request's
// ticket (record key and fingerprint, encoded by the engine), and the object runs the claim
// of the same request machine against its own records, making the conditional write before
// it awaits anything else (IDEM-JS-3). Requests to one object interleave at every await on
// other I/O, so the object keeps the records it has read in memory: every decision and every
// compare-and-set is made against that copy, synchronously, after the last await, so two
// claims whose storage reads settle together can never both see "absent". Completions come
// back as compare-and-set writes, checked against the same copy. Alarms, set from each
// record's deadline, drive expiry (IDEM-TTL-4). In a SQLite-backed object, records in clear
// are read through the synchronous `storage.kv` API: a claim then awaits nothing between
// its read and its write.
//
// Values larger than one storage value may hold (128 KiB in the key-value backend; 2 MB for
// key and value together in SQLite-backed objects) are split over several storage keys,
// written in one atomic `put`.
//
// Why not Workers KV: KV is eventually consistent. A write can take 60 s or more to reach
// other locations, and even "not found" answers are cached, so two requests with one key in
// two places would both see no record and both run. Claims need one serialised writer per
// key, which is what a Durable Object is.
//
// A worker reaches the object through `DurableObjectStore` (shard-store.js), in the messages
// of shard-wire.js; a store inside the object, `DurableObjectLocalStore` (local-store.js),
// claims on the request's own slot, with no ticket in between. Sealing (IDEM-SEAL-1) sits
// here, where records go to and come from the object's storage.
//
// It stays one file because it has one role, the object and its storage: the in-memory copy
// of the records that every claim and compare-and-set decides against, and the writes,
// chunks, deadline index and alarms that keep storage in step with it, are read together.
import { StepKind as Step, unopenedDue } from "./idem_wasm.js";
import { createEngine } from "./options.js";
import { clearRecord, openedRecord, recordSealer } from "./seal.js";
import { APPLY, CLAIM, LOAD, applied, claimed, failure, loaded, readApply, readClaim, readKey } from "./shard-wire.js";
import { expire } from "./stores.js";
import { CLAIM_IN_SLOT, rangeError, takeWrite } from "./util.js";

// Storage key prefixes: records, their further chunks, and the deadline index. An object
// that keeps its own data beside the records (`DurableObjectLocalStore`) puts a prefix of
// its own before these.
const RECORD = "r:";
const CHUNK = "c:";
const DEADLINE = "d:";
/** Where an object that shares its alarm with the records keeps the time of its own alarm. */
const OWN_ALARM = "a:own";
const CACHE_LIMIT = 10_000;

/** The most bytes one storage value holds here: under the key-value backend's 128 KiB per
 * value, with room for the key and the entry's other fields. */
export const CHUNK_BYTES = 120 * 1024;
/** Storage keys one `put` writes atomically. */
export const MAX_PUT_KEYS = 128;
/** The most bytes one atomic write takes, with room to spare: a SQLite-backed object (workerd)
 * refuses a `put` of about 2.2 MB in all with `SQLITE_TOOBIG`, however it is split over keys. */
export const MAX_WRITE_BYTES = 16 * CHUNK_BYTES;
/** The largest record value a shard keeps: the chunks of one atomic put, with room for the
 * deadline index entry and the record entry itself, within `MAX_WRITE_BYTES`. */
export const MAX_VALUE_BYTES = Math.min((MAX_PUT_KEYS - 2) * CHUNK_BYTES, MAX_WRITE_BYTES);

/** The chunks a value of `length` bytes is stored in (at least one). */
const chunksOf = (length) => Math.max(1, Math.ceil(length / CHUNK_BYTES));


function deadlineKey(prefix, deadline, key) {
  return `${prefix}${DEADLINE}${String(deadline).padStart(16, "0")}:${key}`;
}

function chunkKey(prefix, key, i) {
  return `${prefix}${CHUNK}${key}:${i}`;
}

/** The object's synchronous reads (`storage.kv`) where they work, else null. workerd gives
 * every object `storage.kv`, but only a SQLite-backed one answers it: on a key-value-backed
 * object each call throws, so it is tried once, and the object reads through the
 * asynchronous API. */
const kvOf = new WeakMap();
export function syncKv(storage) {
  let kv = kvOf.get(storage);
  if (kv !== undefined) return kv;
  kv = storage.kv;
  if (kv == null || typeof kv.get !== "function") kv = null;
  else {
    try {
      kv.get("idem:kv");
    } catch {
      kv = null;
    }
  }
  kvOf.set(storage, kv);
  return kv;
}

/**
 * A Durable Object class that owns a shard of idempotency records. Export it from the
 * worker and bind it (`[[durable_objects.bindings]] class_name = "IdempotencyShard"`); the
 * worker talks to it through `DurableObjectStore`. The methods `claim`, `apply`, `load` and
 * `alarm` can also be called directly (from a subclass that adds RPC, or from tests).
 */
export class IdempotencyShard {
  #storage;
  /** The synchronous key-value API of a SQLite-backed object (`storage.kv`), when records
   * are kept in clear: a record missing from memory is then read without an await, so that a
   * claim reads, decides and writes in one synchronous step. Null otherwise (records are
   * read through the asynchronous API, and opened with WebCrypto when sealed). */
  #kv = null;
  #prefix;
  #cache = new Map();
  /** With `options.held`: storage key → the in-flight record of a claim kept in memory (a
   * key with no record in storage), until its completion or release. Never evicted. */
  #held = null;
  #engines = new Map();
  #alarm = undefined;
  /** While `alarm()` runs: the earliest deadline written meanwhile (Infinity: none); else
   * null. */
  #alarmRun = null;
  /** Whether the object's one alarm is shared with a host of its own (see `setOwnAlarm`). */
  #shared = false;
  /** With `options.seal`: the sealer of the records it writes to storage (the cache holds
   * them opened), and the chain that puts them in the order they were written. */
  #seal = null;
  #sealing = Promise.resolve();

  /** `options.prefix` goes before every storage key of the records (none for an object
   * that holds records only). With `options.held`, a claim of a key that has no record in
   * storage is kept in this object's memory, not written (IDEM-STORE-8). With
   * `options.sharedAlarm`, the object's alarm is the host's too: the host sets its own
   * through `setOwnAlarm`, and `alarm()` says when that is due. With `options.seal`
   * (`{ keys: [{ id, key }, …] }`), every record is sealed in storage with the first key and
   * opened with any (IDEM-SEAL-1, IDEM-SEAL-2): export a subclass that passes the keys from
   * the environment's secrets. */
  constructor(state, _env, options = {}) {
    this.#storage = state.storage;
    this.#prefix = options.prefix ?? "";
    if (options.held === true) this.#held = new Map();
    this.#shared = options.sharedAlarm === true;
    this.#seal = recordSealer(options.seal);
    if (this.#seal === null) this.#kv = syncKv(state.storage);
  }

  /** The object's HTTP face for `DurableObjectStore`. */
  async fetch(request) {
    const path = new URL(request.url).pathname;
    const h = request.headers;
    try {
      if (path === CLAIM) {
        const { optionsText, now, hi, lo } = readClaim(h);
        return claimed(await this.claim(new Uint8Array(await request.arrayBuffer()), optionsText, now, hi, lo));
      }
      if (path === APPLY) {
        const { key, write, now } = readApply(h, new Uint8Array(await request.arrayBuffer()));
        return applied(await this.apply(key, write, now));
      }
      if (path === LOAD) return loaded(await this.load(readKey(h)));
      return new Response("not found", { status: 404 });
    } catch (err) {
      return failure(err);
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

  /** Makes sure the record for `key` is in memory: undefined once it is (read at once through
   * `storage.kv`), or a promise when it is read through the asynchronous API. Nothing is
   * decided here; callers read `#cache` afterwards, without awaiting in between. */
  #fetch(key) {
    if (this.#cache.has(key) || this.#held?.has(key)) return undefined;
    const kv = this.#kv;
    if (kv === null) return this.#read(key);
    const p = this.#prefix;
    const stored = kv.get(p + RECORD + key) ?? null;
    let entry = null;
    if (stored !== null) {
      let value = stored.value;
      if (stored.chunks > 1) {
        value = new Uint8Array(stored.length);
        value.set(stored.value, 0);
        let at = stored.value.byteLength;
        for (let i = 1; i < stored.chunks; i++) {
          const part = kv.get(chunkKey(p, key, i));
          value.set(part, at);
          at += part.byteLength;
        }
      }
      // A sealed record, with no seal here, is refused (IDEM-SEAL-3) and not cached.
      entry = { version: stored.version, value: clearRecord(key, value), deadline: stored.deadline, chunks: stored.chunks };
    }
    if (this.#cache.size >= CACHE_LIMIT) this.#evict();
    this.#cache.set(key, entry);
    return undefined;
  }

  /** `decide()` with the record of `key` in memory: at once when it is, else once it has
   * been read, and read again if another request's read evicted it meanwhile (`#evict`),
   * with nothing awaited between the last look and `decide`. `#current` takes a key not in
   * memory for a key without a record, so nothing decides after an await of its own. */
  #withRecord(key, decide) {
    const fetched = this.#fetch(key);
    return fetched === undefined ? decide() : fetched.then(() => this.#withRecord(key, decide));
  }

  /** `#fetch` through the asynchronous API. After each await, the copy already in memory
   * wins: another claim may have read or written it meanwhile. */
  async #read(key) {
    // A sealed write still on its way (of a key evicted from the cache since) reaches
    // storage before storage is read.
    if (this.#seal !== null) await this.#sealing;
    if (this.#cache.has(key) || this.#held?.has(key)) return;
    const stored = await this.#storage.get(this.#prefix + RECORD + key);
    if (this.#cache.has(key) || this.#held?.has(key)) return;
    let entry = stored ?? null;
    if (entry !== null && entry.chunks > 1) {
      const keys = [];
      for (let i = 1; i < entry.chunks; i++) keys.push(chunkKey(this.#prefix, key, i));
      const parts = await this.#storage.get(keys);
      if (this.#cache.has(key) || this.#held?.has(key)) return;
      const value = new Uint8Array(entry.length);
      value.set(entry.value, 0);
      let at = entry.value.byteLength;
      for (const k of keys) {
        const part = parts.get(k);
        value.set(part, at);
        at += part.byteLength;
      }
      entry = { version: entry.version, value, deadline: entry.deadline, chunks: entry.chunks };
    }
    if (entry !== null) {
      // Opened for the cache, which then holds it as the engine reads it. A record that does
      // not open (or a sealed one, without a seal) is not cached: every request for it is
      // refused (IDEM-SEAL-3).
      const value = await openedRecord(this.#seal, key, entry.value);
      if (this.#cache.has(key) || this.#held?.has(key)) return;
      entry = { version: entry.version, value, deadline: entry.deadline, chunks: entry.chunks };
    }
    if (this.#cache.size >= CACHE_LIMIT) this.#evict();
    this.#cache.set(key, entry);
  }

  /** Forgets the records read longest ago, an eighth of the cache at once (storage still
   * has them). A Map keeps the slots of deleted entries until it is rebuilt, so taking the
   * oldest one at a time would walk over every slot deleted before it, each time. */
  #evict() {
    let left = CACHE_LIMIT >> 3;
    for (const key of this.#cache.keys()) {
      this.#cache.delete(key);
      if (--left === 0) break;
    }
  }

  /** The record of `key` as this object sees it: a claim held in memory, else the copy of
   * what storage holds. */
  #current(key) {
    return this.#held?.get(key) ?? this.#cache.get(key) ?? null;
  }

  /** The compare-and-set against the copy in memory (the object's current record, never a
   * caller's earlier read), then to storage: the storage promises, or null when the
   * precondition failed. `extra` (`{ puts, deletes }`, the handler's own writes) goes to
   * storage in the same atomic write as the record. When claims are held, a record in
   * flight (`write.inFlight`, the engine's word) is kept in memory while storage has none
   * of the key, and not written; `now` drops held claims past their deadline. */
  #write(key, write, extra, now) {
    const current = this.#current(key);
    const holds = write.expect === null ? current === null : current !== null && current.version === write.expect;
    if (!holds) return null;
    const overhead = this.#seal?.overhead ?? 0;
    if (write.value !== null && write.value.byteLength + overhead > MAX_VALUE_BYTES) {
      throw rangeError("IDEM-STORE-5", `a record of ${write.value.byteLength} bytes exceeds the ${MAX_VALUE_BYTES - overhead} a shard keeps`);
    }
    const ops = [];
    // What storage holds: a held claim stands for a key that has none.
    const stored = this.#cache.get(key) ?? null;
    if (this.#held !== null) {
      const held = this.#held.delete(key);
      if (stored === null && write.inFlight === true) {
        this.#hold(key, { version: write.version, value: write.value, deadline: write.deadline }, now);
        return ops;
      }
      // A released claim leaves nothing behind; anything else goes to storage below.
      if (stored === null && held && write.value === null) return ops;
    }
    const deletes = [];
    if (stored !== null) {
      const current = stored;
      if (current.deadline > 0 && (write.value === null || current.deadline !== write.deadline)) {
        deletes.push(deadlineKey(this.#prefix, current.deadline, key));
      }
      const chunks = current.chunks ?? Math.ceil(current.value.byteLength / CHUNK_BYTES);
      const keep = write.value === null ? 1 : chunksOf(write.value.byteLength + overhead);
      for (let i = keep; i < chunks; i++) deletes.push(chunkKey(this.#prefix, key, i));
    }
    const p = this.#prefix;
    const batch = extra === undefined ? {} : Object.fromEntries(extra.puts);
    if (extra !== undefined) deletes.push(...extra.deletes);
    if (write.value === null) {
      this.#cache.set(key, null);
      deletes.push(p + RECORD + key);
    } else {
      const chunks = chunksOf(write.value.byteLength + overhead);
      this.#cache.set(key, { version: write.version, value: write.value, deadline: write.deadline, chunks });
      if (write.deadline > 0) batch[deadlineKey(p, write.deadline, key)] = write.version;
    }
    // One put and one delete, with nothing awaited in between: the object's storage commits
    // them as one atomic write.
    const commit = (value) => {
      if (value !== null) {
        const chunks = chunksOf(value.byteLength);
        const first = chunks === 1 ? value : value.subarray(0, CHUNK_BYTES);
        batch[p + RECORD + key] = { version: write.version, value: first, deadline: write.deadline, expires: write.expires, chunks, length: value.byteLength };
        for (let i = 1; i < chunks; i++) batch[chunkKey(p, key, i)] = value.subarray(i * CHUNK_BYTES, (i + 1) * CHUNK_BYTES);
      }
      const out = [];
      if (Object.keys(batch).length > 0) out.push(this.#storage.put(batch));
      if (deletes.length > 0) out.push(this.#storage.delete(deletes));
      return out;
    };
    if (this.#seal === null || write.value === null) {
      // Sealed writes still on their way go to storage first: storage takes the writes in
      // the order the cache did.
      if (this.#seal === null) return this.#refusedForgets(key, () => commit(write.value));
      const after = this.#sealing.then(() => Promise.all(commit(null)));
      this.#sealing = after.catch(() => this.#cache.clear());
      return [after];
    }
    // The decision was made above, against the cache; sealing only delays the put, and the
    // chain keeps the puts in the order of the writes.
    const seal = this.#seal;
    const value = write.value;
    const sealed = this.#sealing.then(() => seal.seal(key, value)).then((bytes) => Promise.all(commit(bytes)));
    this.#sealing = sealed.catch(() => {
      // The cache is ahead of storage: forget it, so that every key is read from storage
      // again, as after a restart.
      this.#cache.clear();
    });
    return [sealed];
  }

  /** `commit()`'s storage promises; if storage refuses any of them (at once or later), the
   * copy of `key` in memory, which is already ahead of storage, is forgotten, so that the
   * key is read from storage again: a completion whose write with the handler's writes
   * failed is never replayed as stored (IDEM-STORE-7). */
  #refusedForgets(key, commit) {
    const forget = () => this.#cache.delete(key);
    let out;
    try {
      out = commit();
    } catch (err) {
      forget();
      throw err;
    }
    for (const op of out) op.catch(forget);
    return out;
  }

  /** Keeps a claim in memory, after looking at the two claims held longest: one past its
   * deadline (its key's expiry: its attempt died without a release) is dropped, as storage
   * would drop it, and one that is not goes to the back, so that every held claim is
   * looked at in turn. */
  #hold(key, entry, now) {
    const held = this.#held;
    // A caller that gives no time drops nothing.
    const at = Number.isFinite(now) ? now : -Infinity;
    let looked = 0;
    for (const [k, e] of held) {
      if (looked++ === 2) break;
      held.delete(k);
      if (e.deadline > at) held.set(k, e);
    }
    held.set(key, entry);
  }

  /** `#schedule` after a write that storage has taken: the write stands whatever the alarm
   * does. An alarm that cannot be read or set (an object class without `alarm()`, a storage
   * error) leaves the record to the next write's alarm, with the object's alarm read again
   * then; the engine reads every expiry from the records meanwhile, so only storage is kept
   * longer (IDEM-STORE-9). */
  async #scheduleAfter(deadline) {
    try {
      await this.#schedule(deadline);
    } catch {
      this.#alarm = undefined;
    }
  }

  async #schedule(deadline) {
    if (!(deadline > 0)) return;
    // While `alarm()` runs, the alarm it is setting is not known yet: it sets the earliest
    // deadline written meanwhile too, once it has listed what remains.
    if (this.#alarmRun !== null) {
      this.#alarmRun = Math.min(this.#alarmRun, deadline);
      return;
    }
    if (this.#alarm === undefined) this.#alarm = (await this.#storage.getAlarm()) ?? null;
    if (this.#alarm === null || deadline < this.#alarm) {
      this.#alarm = deadline;
      await this.#storage.setAlarm(deadline);
    }
  }

  /** Runs the claim of a worker's request next to the storage and returns what was claimed,
   * for the worker. */
  async claim(ticketBytes, optionsText, now, hi, lo) {
    const engine = this.#engine(optionsText);
    const slot = engine.resume(ticketBytes, hi >>> 0, lo >>> 0);
    try {
      const key = engine.storageKey(slot);
      const claim = await this.#withRecord(key, () => this.#claimIn(engine, slot, key, now, engine.poll(slot, now)));
      const out = engine.claimedBytes(slot);
      await Promise.all(claim.ops);
      await this.#scheduleAfter(claim.deadline);
      return out;
    } finally {
      engine.end(slot);
    }
  }

  /**
   * The claim of the request in `slot` of `engine`, an engine of this isolate (a store
   * inside the object: `DurableObjectLocalStore`), made on that slot itself, so that nothing
   * crosses as a ticket. `step` is the `Claim` step just polled. Returns the machine's next
   * step once the claim is made and written, or a promise of it while its record is read or
   * its write stored.
   */
  [CLAIM_IN_SLOT](engine, slot, key, now, step) {
    return this.#withRecord(key, () => this.#settle(engine, slot, key, now, this.#claimIn(engine, slot, key, now, step, true)));
  }

  /** The next step of a claim made on a slot: once a write of it is stored, the machine
   * learns that it was applied, and goes on. A write storage refuses rejects, and the
   * machine, told by its host, answers 503 with nothing run (IDEM-STORE-4): a claim the
   * machine took for applied before storage took it would run its handler under a claim
   * that does not exist. */
  #settle(engine, slot, key, now, claim) {
    if (claim.ops.length === 0) return claim.step;
    return Promise.all(claim.ops).then(async () => {
      engine.applied(slot, now, true);
      await this.#scheduleAfter(claim.deadline);
      return this.#withRecord(key, () => this.#settle(engine, slot, key, now, this.#claimIn(engine, slot, key, now, engine.poll(slot, now), true)));
    });
  }

  /** Feeds the slot's machine the record in memory and applies its writes, from `step` (its
   * last poll) to its first step that is not a store step: `{ step, ops, deadline }`, the
   * storage promises of its writes and the deadline of the last one. Nothing is awaited: the
   * read, the decision and the compare-and-set are one step of this object. With `stored`,
   * it stops at the first write that goes to storage, whose `applied` is the caller's to
   * report once storage took it (`#settle`). */
  #claimIn(engine, slot, key, now, step, stored = false) {
    const ops = [];
    let deadline = 0;
    for (; step === Step.Claim || step === Step.Load || step === Step.Apply; step = engine.poll(slot, now)) {
      if (step !== Step.Apply) {
        engine.record(slot, now, this.#current(key)?.value ?? undefined);
        continue;
      }
      const write = takeWrite(engine, slot);
      const done = this.#write(key, write, undefined, now);
      if (done !== null && done.length > 0) {
        ops.push(...done);
        deadline = write.deadline;
        if (stored) return { step, ops, deadline };
      }
      engine.applied(slot, now, done !== null);
    }
    return { step, ops, deadline };
  }

  /** Applies a compare-and-set write from a worker (a completion or a heartbeat). `extra`
   * (`{ puts: [[key, value]…], deletes: [key…] }`) is written in the same atomic write, and
   * only if the precondition holds. */
  async apply(key, write, now, extra) {
    const ops = await this.#withRecord(key, () => this.#write(key, write, extra, now));
    if (ops === null) return false;
    if (ops.length === 0) return true;
    await Promise.all(ops);
    await this.#scheduleAfter(write.value === null ? 0 : write.deadline);
    return true;
  }

  /** The stored record, `{ version, value }`, or null. */
  async load(key) {
    const entry = await this.#withRecord(key, () => this.#current(key));
    return entry === null ? null : { version: entry.version, value: entry.value };
  }

  /** With a shared alarm: the host object's own alarm, at `time` (ms since the epoch), or
   * none with null. The object's one alarm is then set to the earlier of it and the next
   * record deadline; `alarm()` resolves true once it is due. */
  async setOwnAlarm(time) {
    const key = this.#prefix + OWN_ALARM;
    if (time === null) {
      await this.#storage.delete(key);
      return;
    }
    if (!Number.isFinite(time)) throw rangeError("IDEM-JS-1", "an alarm time is a number of milliseconds since the epoch, or null");
    await this.#storage.put(key, time);
    await this.#schedule(time);
  }

  /** With a shared alarm: the host object's own alarm time, or null. */
  async getOwnAlarm() {
    return (await this.#storage.get(this.#prefix + OWN_ALARM)) ?? null;
  }

  /** A due record that does not open here (IDEM-SEAL-3), by idem-core's rule
   * (`unopenedDue`) from the `expires` its entry keeps in clear: deleted once it need no
   * longer be kept, which takes no reading, and until then due again at `expires`, out of the
   * way of the records due behind it. A record whose entry has no `expires` (written before
   * entries kept it) stays, out of the index. */
  async #unopened(indexKey, key, version, now) {
    const p = this.#prefix;
    const stored = await this.#storage.get(p + RECORD + key);
    const deletes = [indexKey];
    if (stored?.version === version && Number.isFinite(stored.expires) && stored.expires > 0) {
      const at = unopenedDue(now, stored.expires);
      if (at === undefined) {
        deletes.push(p + RECORD + key);
        for (let i = 1; i < stored.chunks; i++) deletes.push(chunkKey(p, key, i));
      } else {
        await this.#storage.put(deadlineKey(p, at, key), version);
      }
    }
    await this.#storage.delete(deletes);
  }

  /** Expires every record that is due, then sets the alarm for the next deadline (or the
   * host's own alarm, when it is earlier). Resolves to whether the host's own alarm
   * (`setOwnAlarm`) was due. With `work`, the host's alarm work, that is run first, and the
   * alarm is spent only once `work` has resolved: if it throws, the error is thrown from
   * here, the platform runs the alarm again, and `work` with it. Without `work`, a due alarm
   * is spent before this resolves, and the host does its work after. */
  async alarm(work) {
    this.#alarmRun = Infinity;
    try {
      return await this.#alarmOnce(work);
    } finally {
      this.#alarmRun = null;
    }
  }

  async #alarmOnce(work) {
    const now = Date.now();
    const p = this.#prefix;
    const due = await this.#storage.list({ start: p + DEADLINE, end: deadlineKey(p, now + 1, ""), limit: 256 });
    for (const [indexKey, version] of due) {
      const key = indexKey.slice(p.length + DEADLINE.length + 17);
      let write;
      let current;
      try {
        current = await this.#withRecord(key, () => this.#cache.get(key) ?? null);
        // The cache holds records opened (or in clear), as the engine reads them.
        if (current !== null && current.version === version) write = expire(now, current.value);
      } catch (err) {
        // Sealed with a key this object does not hold (IDEM-SEAL-3), or bytes that are not a
        // record this version reads (IDEM-REC-1): idem-core's rule for a record it cannot
        // open, from the expiry kept in clear beside it. Thrown, one such record would stop
        // the expiry of every record due after it.
        if (err?.code !== "IDEM-SEAL-3" && err?.code !== "IDEM-REC-1") throw err;
        await this.#unopened(indexKey, key, version, now);
        continue;
      }
      if (current === null || current.version !== version) {
        await this.#storage.delete(indexKey);
        continue;
      }
      if (write === undefined) continue;
      write.expect = current.version;
      const ops = await this.#withRecord(key, () => this.#write(key, write, undefined, now));
      if (ops !== null) await Promise.all(ops);
    }
    const next = await this.#storage.list({ start: p + DEADLINE, end: p + DEADLINE + "\uffff", limit: 1 });
    let at = null;
    for (const [indexKey] of next) {
      const from = p.length + DEADLINE.length;
      at = Math.max(Number(indexKey.slice(from, from + 16)), now + 1);
    }
    let ownDue = false;
    if (this.#shared) {
      let own = await this.getOwnAlarm();
      if (own !== null && own <= now) {
        if (work !== undefined) await work();
        ownDue = true;
        own = null;
        await this.#storage.delete(p + OWN_ALARM);
      }
      if (own !== null && (at === null || own < at)) at = own;
    }
    // The earliest deadline written while this ran (its write found no alarm to compare with).
    if (this.#alarmRun !== Infinity) at = Math.min(at ?? Infinity, Math.max(this.#alarmRun, now + 1));
    this.#alarm = at;
    this.#alarmRun = null;
    if (at === null) await this.#storage.deleteAlarm();
    else await this.#storage.setAlarm(at);
    return ownDue;
  }
}
