// `DurableObjectLocalStore`, the store for a handler whose data lives in a Durable Object:
// the records live in that object's own storage, kept by an `IdempotencyShard` inside it
// (shard.js), and the handler's own writes (`transaction`) are committed in the same atomic
// write as the completion that stores its response.
import { attemptOf, attemptOfContext } from "./attempt.js";
import { CHUNK_BYTES, IdempotencyShard, MAX_PUT_KEYS, MAX_VALUE_BYTES, syncKv } from "./shard.js";
import { CLAIM_IN_SLOT, rangeError } from "./util.js";
import { uncommitted } from "./errors.js";

/** The handler's own storage keys one transaction writes at most: with the record's chunks,
 * its entry and its deadline, they fit in the `MAX_PUT_KEYS` of one atomic put. */
export const TRANSACTION_KEYS = 32;

/**
 * The store for a handler whose data lives in a Durable Object: the records live in that
 * object's own storage, under `prefix` (default `"idem:"`), and the handler runs inside the
 * object. Claims and completions are made next to the storage, so a fresh request costs the
 * worker one round trip to the object; and `transaction(context, fn)` commits the handler's
 * own writes in the same atomic write as the completion that stores its response (the
 * reason idem records writes, not actions). Create one per object, in its constructor, and
 * call its `alarm()` from the object's `alarm()` (expiry). The object's one alarm is shared:
 * set an alarm of the object's own with the store's `setAlarm(time)`, and do its work when
 * the store's `alarm()` resolves true.
 *
 * `writesOnly: true` is for a handler whose every effect is a write of its transaction: a
 * claim is then kept in the object's memory, and a fresh request writes once, at its
 * completion, with the handler's writes (IDEM-STORE-8). While the object lives, every other
 * request for the key sees the claim. If the object dies first, the claim dies with the
 * uncommitted writes, and the next request for the key runs as a first attempt, at once.
 * That is only safe when the attempt that died left nothing behind: no call to another
 * service, no write outside the transaction.
 */
export class DurableObjectLocalStore {
  #storage;
  #prefix;
  #shard;
  /** Attempt → the handler's transaction, waiting for its completion. */
  #open = new Map();

  /** The largest response kept (IDEM-STORE-5): the record, with the handler's writes, still
   * goes in one atomic put (a put of more than it takes fails the completion: IDEM-STORE-7). */
  maxResponseBytes = Math.min((MAX_PUT_KEYS - 2 - TRANSACTION_KEYS) * CHUNK_BYTES, MAX_VALUE_BYTES) - 64 * 1024;

  constructor(state, options = {}) {
    if (state == null || state.storage == null || typeof state.storage.put !== "function") {
      throw rangeError("IDEM-JS-1", "DurableObjectLocalStore needs the Durable Object's state (this.ctx)");
    }
    const prefix = options.prefix ?? "idem:";
    if (typeof prefix !== "string" || prefix === "") {
      throw rangeError("IDEM-JS-1", "options.prefix must be a non-empty string: the records' storage keys start with it");
    }
    const writesOnly = options.writesOnly ?? false;
    if (typeof writesOnly !== "boolean") {
      throw rangeError("IDEM-JS-1", "options.writesOnly must be true or false");
    }
    this.#storage = state.storage;
    this.#prefix = prefix;
    this.#shard = new IdempotencyShard(state, undefined, { prefix, held: writesOnly, sharedAlarm: true, seal: options.seal });
  }

  claim(_key, ticket, optionsText, now, hi, lo) {
    return this.#shard.claim(ticket, optionsText, now, hi, lo);
  }

  /** The claim, made on the request's own slot (the drive loop's way with this store: the
   * engine is in this isolate, so nothing crosses as a ticket). */
  [CLAIM_IN_SLOT](engine, slot, key, now, step) {
    return this.#shard[CLAIM_IN_SLOT](engine, slot, key, now, step);
  }

  load(key) {
    return this.#shard.load(key);
  }

  async apply(key, write, now, info) {
    const attempt = info?.outcome === undefined ? undefined : attemptOf(key, info.attempt);
    const open = attempt === undefined ? undefined : this.#open.get(attempt);
    // A transaction still running when its request answered is not part of the answer.
    if (open === undefined || !open.ready) {
      if (open !== undefined) this.#open.delete(attempt);
      return this.#shard.apply(key, write, now);
    }
    // Only an answer whose response is stored commits the handler's writes, in the same
    // atomic write (IDEM-STORE-7); anything else leaves them unwritten.
    const commits = write.storesResponse && info.outcome === "answered";
    if (!commits) {
      this.#open.delete(attempt);
      return this.#shard.apply(key, write, now);
    }
    let applied;
    try {
      applied = await this.#shard.apply(key, write, now, open.writes());
    } catch (err) {
      // Not written with the record: the handler's response must not go out (IDEM-STORE-7).
      throw uncommitted(err);
    }
    // A completion that lost its race keeps the writes for this attempt's next completion
    // (made from the record as it reads after a write of its own whose answer was lost); the
    // end of the attempt drops them. Never given up here, or the next completion would
    // store the response without them.
    if (applied) this.#open.delete(attempt);
    return applied;
  }

  /** The attempt's request is over: writes it left uncommitted are dropped. Returns whether
   * there were any handed over (IDEM-STORE-7). */
  end(key, attempt) {
    const id = attemptOf(key, attempt);
    const open = this.#open.get(id);
    this.#open.delete(id);
    return open?.ready === true;
  }

  /** Expires what is due; call it from the object's `alarm()`. The object has one alarm,
   * shared with the records: an object with an alarm of its own sets it with `setAlarm`
   * (never `storage.setAlarm`, which would move the records' expiry) and passes its alarm
   * work as `work`: that runs when its alarm is due, and the alarm is spent once `work` has
   * resolved; if `work` throws, so does this, and the platform's retry of the alarm runs it
   * again. Resolves to whether the object's own alarm was due. */
  alarm(work) {
    if (work !== undefined && typeof work !== "function") throw rangeError("IDEM-JS-1", "alarm(work): work is the object's own alarm work, a function");
    return this.#shard.alarm(work);
  }

  /** The object's own alarm at `time` (ms since the epoch), or none with null: kept beside
   * the records' deadlines, so that neither moves the other. `alarm()` resolves true when it
   * is due. */
  setAlarm(time) {
    return this.#shard.setOwnAlarm(time);
  }

  /** The object's own alarm time (`setAlarm`), or null. */
  getAlarm() {
    return this.#shard.getOwnAlarm();
  }

  /**
   * Runs `fn(tx)` for the request whose idempotency context is `context` (`idempotencyOf(request)`,
   * or the context `Idempotency#handle` passes). `tx.get(key)` reads the object's storage as
   * the transaction changed it; `tx.put(key, value)` and `tx.delete(key)` are written with
   * the completion that stores the response, in one atomic write, or never: not if `fn`
   * throws, not if the response is not kept, not if the lease was taken over meanwhile.
   * Keys starting with the store's prefix are refused. Resolves to what `fn` returned.
   */
  async transaction(context, fn) {
    const attempt = attemptOfContext(context);
    if (this.#open.has(attempt)) throw rangeError("IDEM-JS-1", "this request already has a transaction open");
    // The attempt's place is taken before `fn` runs, so that a second call of the same
    // request is refused instead of replacing the first one's writes.
    const tx = new ObjectTransaction(this.#storage, this.#prefix);
    this.#open.set(attempt, tx);
    try {
      const result = await fn(tx);
      if (this.#open.get(attempt) !== tx) throw rangeError("IDEM-LEASE-3", "the request was over before its transaction was done");
      tx.ready = true;
      return result;
    } catch (err) {
      if (this.#open.get(attempt) === tx) this.#open.delete(attempt);
      throw err;
    }
  }
}

/** A handler's writes, held until the completion that stores its response. */
class ObjectTransaction {
  /** Whether `fn` is done and the writes wait for the completion. */
  ready = false;
  #storage;
  #prefix;
  /** Key → value, or undefined for a delete. */
  #changes = new Map();

  constructor(storage, prefix) {
    this.#storage = storage;
    this.#prefix = prefix;
  }

  #check(key) {
    if (typeof key !== "string" || key === "") throw rangeError("IDEM-JS-1", "a storage key is a non-empty string");
    if (key.startsWith(this.#prefix)) throw rangeError("IDEM-JS-1", `storage keys starting with "${this.#prefix}" hold idempotency records`);
  }

  /** The value stored under `key`, as this transaction has changed it. */
  async get(key) {
    this.#check(key);
    if (this.#changes.has(key)) return this.#changes.get(key);
    // A SQLite-backed object answers at once (`storage.kv`); the value is the same.
    const kv = syncKv(this.#storage);
    return kv !== null ? kv.get(key) : this.#storage.get(key);
  }

  /** Writes `value` under `key` with the completion. */
  put(key, value) {
    this.#check(key);
    if (value === undefined) throw rangeError("IDEM-JS-1", "put needs a value (use delete to remove a key)");
    if (!this.#changes.has(key) && this.#changes.size >= TRANSACTION_KEYS) {
      throw rangeError("IDEM-JS-1", `a transaction writes at most ${TRANSACTION_KEYS} keys`);
    }
    this.#changes.set(key, value);
  }

  /** Deletes `key` with the completion. */
  delete(key) {
    this.#check(key);
    if (!this.#changes.has(key) && this.#changes.size >= TRANSACTION_KEYS) {
      throw rangeError("IDEM-JS-1", `a transaction writes at most ${TRANSACTION_KEYS} keys`);
    }
    this.#changes.set(key, undefined);
  }

  /** `{ puts, deletes }` for the completion's write. */
  writes() {
    const puts = [];
    const deletes = [];
    for (const [k, v] of this.#changes) {
      if (v === undefined) deletes.push(k);
      else puts.push([k, v]);
    }
    return { puts, deletes };
  }
}
