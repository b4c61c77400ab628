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
import { expire } from "./idem_wasm.js";
import { StoreFullError, rangeError } from "./util.js";

// Expiry work done on the way by each write, as idem-core's MemoryStore does.
const SWEEP_PER_WRITE = 32;

/**
 * Records in a Map, with a deadline heap so that expiry costs what expires, not what is
 * stored. For tests, single-process servers and development; it is not shared between
 * processes or isolates.
 *
 * When full (`maxEntries`), a claim of a new key first sweeps everything due and then, if
 * still full, throws `StoreFullError` (503 store-full, IDEM-STORE-3). Writes to existing
 * records are always accepted, and no live record is ever evicted.
 */
export class MemoryStore {
  #records = new Map();
  #heap = [];
  #max;
  #expired = 0;

  constructor({ maxEntries = 1_000_000 } = {}) {
    if (!(Number.isInteger(maxEntries) && maxEntries > 0)) {
      throw rangeError("IDEM-JS-1", "maxEntries must be a positive integer");
    }
    this.#max = maxEntries;
  }

  /** Records held. */
  get size() {
    return this.#records.size;
  }

  /** Records expired (tombstoned or deleted) so far. */
  get expired() {
    return this.#expired;
  }

  /** The earliest deadline of any record (ms since the epoch), or undefined. */
  get nextDeadline() {
    return this.#heap.length > 0 ? this.#heap[0].deadline : undefined;
  }

  load(key) {
    return this.#records.get(key) ?? null;
  }

  apply(key, write, now) {
    this.#sweep(now, SWEEP_PER_WRITE);
    const current = this.#records.get(key);
    const holds = write.expect === null ? current === undefined : current !== undefined && current.version === write.expect;
    if (!holds) return false;
    if (current === undefined && write.value !== null && this.#records.size >= this.#max) {
      this.#sweep(now, Infinity);
      if (this.#records.size >= this.#max) throw new StoreFullError(`idempotency store full (${this.#records.size} records)`);
    }
    this.#put(key, write);
    return true;
  }

  /** Applies expiry to every record due at `now`; returns how many changed. */
  sweep(now) {
    return this.#sweep(now, Infinity);
  }

  #put(key, write) {
    if (write.value === null) {
      this.#records.delete(key);
      return;
    }
    const entry = { version: write.version, value: write.value, deadline: write.deadline };
    this.#records.set(key, entry);
    this.#push({ deadline: write.deadline, key, version: write.version });
  }

  #sweep(now, budget) {
    let done = 0;
    const heap = this.#heap;
    while (done < budget && heap.length > 0 && heap[0].deadline <= now) {
      const due = this.#pop();
      const current = this.#records.get(due.key);
      // A heap entry outlived by a later write is stale: that write pushed its own.
      if (current === undefined || current.version !== due.version) continue;
      const write = expire(now, current.value);
      if (write === undefined) continue;
      try {
        this.#put(due.key, { expect: current.version, value: write.value ?? null, version: write.version, deadline: write.deadline });
      } finally {
        write.free();
      }
      this.#expired++;
      done++;
    }
    return done;
  }

  #push(item) {
    const heap = this.#heap;
    heap.push(item);
    let i = heap.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (heap[parent].deadline <= item.deadline) break;
      heap[i] = heap[parent];
      i = parent;
    }
    heap[i] = item;
  }

  #pop() {
    const heap = this.#heap;
    const top = heap[0];
    const last = heap.pop();
    if (heap.length > 0) {
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        if (l >= heap.length) break;
        const r = l + 1;
        const c = r < heap.length && heap[r].deadline < heap[l].deadline ? r : l;
        if (heap[c].deadline >= last.deadline) break;
        heap[i] = heap[c];
        i = c;
      }
      heap[i] = last;
    }
    return top;
  }
}
