// The in-process store. Stores keep opaque record bytes under a string key, with the
// record's version beside them; they know nothing of idempotency except the
// compare-and-set contract (IDEM-STORE-1):
//
//   load(key)              → { version, value } | null
//   apply(key, write, now) → true when `write.expect` held (null: no record may exist;
//                            otherwise the stored version must equal it) and the write was
//                            made in the same step; false, changing nothing, otherwise.
//
// A write puts `write.value` with `write.version`, or deletes the record when `value` is
// null. `write.deadline` says when the record next changes on its own (IDEM-TTL-4).
import { Records, expire as expireRecord, redisKeys as redisKeysOf, responseApart as responseApartOf } from "./idem_wasm.js";
import { recordSealer } from "./seal.js";
import { SealedRecords } from "./sealed-records.js";
import { StoreFullError, rangeError, readWrite } from "./util.js";

/** The records of a MemoryStore in clear (inside the WebAssembly module), or null for other
 * stores and for a sealed MemoryStore: `Idempotency` claims and completes in them directly,
 * one call each. */
export let recordsOf;

/**
 * idem-core's own `MemoryStore`, inside the WebAssembly module: a hash map with a deadline
 * index, so that expiry costs what expires, not what is stored (each write sweeps up to 32
 * due records; `sweep(now)` sweeps all). For tests, single-process servers and development;
 * it is not shared between processes or isolates.
 *
 * When full (`maxEntries` records, or `maxBytes` bytes of keys and records), a claim of a
 * new key first sweeps everything due and then, if still full, is refused with 503
 * store-full (IDEM-STORE-3). Writes to existing records are always accepted, and no live
 * record is ever evicted.
 *
 * `withIdempotency` and `Idempotency` use it directly, without encoding records. It also
 * implements the generic store interface (`load`, `apply`) for the engine's storage keys.
 *
 * With `seal: { keys: [{ id, key }, …] }` it holds every record sealed instead (AES-256-GCM,
 * as RedisStore seals them; IDEM-SEAL-1), so that no response is kept in clear in the
 * process's memory: sealed in JavaScript with WebCrypto (sealed-records.js says why not in
 * the module), and used through `load` and `apply` like any other store.
 */
export class MemoryStore {
  /** The module's records, or null when sealed. */
  #records = null;
  /** The sealed records, or null. */
  #sealed = null;

  static {
    recordsOf = (store) => (store !== null && typeof store === "object" && #records in store ? store.#records : null);
  }

  constructor({ maxEntries = 1_000_000, maxBytes = 256 * 1024 * 1024, seal } = {}) {
    if (!(Number.isInteger(maxEntries) && maxEntries > 0)) {
      throw rangeError("IDEM-JS-1", "maxEntries must be a positive integer");
    }
    if (!(Number.isInteger(maxBytes) && maxBytes > 0)) {
      throw rangeError("IDEM-JS-1", "maxBytes must be a positive integer");
    }
    const sealer = recordSealer(seal);
    if (sealer === null) this.#records = new Records(maxEntries, maxBytes);
    else this.#sealed = new SealedRecords(maxEntries, maxBytes, sealer);
  }

  /** Records held. */
  get size() {
    return (this.#sealed ?? this.#records).size;
  }

  /** Bytes held, as counted against `maxBytes`. */
  get bytes() {
    return (this.#sealed ?? this.#records).bytes;
  }

  /** Records expired (tombstoned or deleted) so far. */
  get expired() {
    return (this.#sealed ?? this.#records).expired;
  }

  /** The earliest deadline of any record (ms since the epoch), or undefined. */
  get nextDeadline() {
    return (this.#sealed ?? this.#records).nextDeadline;
  }

  /**
   * Replaces a sealed store's keys while it runs, keeping its records: how a memory store
   * rotates them (IDEM-SEAL-2), since its records do not outlive the process. `seal` is the
   * constructor's option. A record whose key is no longer on the list is answered 500
   * record-sealed and never executed (IDEM-SEAL-3). Returns false, changing nothing, for a
   * store made without `seal`.
   */
  replaceSeal(seal) {
    if (this.#sealed === null) return false;
    const sealer = recordSealer(seal);
    if (sealer === null) throw rangeError("IDEM-JS-1", "replaceSeal needs { keys: [{ id, key }, …] }");
    this.#sealed.seal = sealer;
    return true;
  }

  /** The record under a storage key in the form this store holds it, for inspection: its
   * sealed bytes in a sealed store, else the record's bytes; or undefined. */
  stored(key) {
    return this.#sealed !== null ? this.#sealed.stored(key) : this.#records.load(key);
  }

  load(key) {
    if (this.#sealed !== null) return this.#sealed.load(key);
    const value = this.#records.load(key);
    return value === undefined ? null : { version: this.#records.version(key), value };
  }

  apply(key, write, now) {
    if (this.#sealed !== null) return this.#sealed.apply(key, write, now);
    const done = this.#records.apply(key, write.expect ?? undefined, write.value ?? undefined, now);
    if (done === 2) throw new StoreFullError(`idempotency store full (${this.#records.size} records)`);
    return done === 1;
  }

  /** Applies expiry to every record due at `now`; returns how many changed. */
  sweep(now) {
    return (this.#sealed ?? this.#records).sweep(now);
  }
}

/**
 * For stores of your own: the write that applies the passage of time to a stored record
 * `value` at `now` (ms) — its response dropped (a tombstone, still refusing the key with 410),
 * or the record deleted once its key and any live lease have ended — or undefined when
 * nothing is due. Set `write.expect` to the stored version and apply it like any other write.
 * A sweep finds due records by each write's `deadline`; a store with a time-to-live of its
 * own sets it from `write.expires`, never from `deadline` (IDEM-TTL-3, IDEM-TTL-4).
 */
export function expire(now, value) {
  const bytes = expireRecord(now, value);
  return bytes === undefined ? undefined : readWrite(bytes);
}

/**
 * For stores of your own that delete on a time-to-live: the record `value` as it stands once
 * its response has expired (its tombstone, the same version), or undefined when it holds no
 * response that expires before it. Keep the response apart, expiring at the write's
 * `deadline`, and this for the record's whole `expires` (IDEM-STORE-9), as RedisStore does.
 */
export function responseApart(value) {
  return responseApartOf(value);
}

/** The Redis keys `[record, response]` of a storage key under `prefix` (undefined: `idem:`),
 * as every Redis store names them, the Rust one included (idem-core's). */
export function redisKeys(prefix, storageKey) {
  return redisKeysOf(prefix, storageKey);
}
