// A sealed MemoryStore's records: sealed bytes under their storage keys, in JavaScript, so
// that no response is kept in clear in the process's memory (IDEM-SEAL-1).
//
// Why not in the WebAssembly module, beside the records of a MemoryStore in clear: the
// module reads every record it holds (to expire it, to count it), and sealed bytes cannot be
// read without AES, which the module does not carry (its size matters more than this store's
// speed) and WebCrypto does here. So the records are held as RedisStore holds them: each
// beside its version and its retention (`write.expires`), and a completed record's tombstone
// sealed beside it when its response expires first (`responseApart`). Expiry then never
// opens a record: when the response expires the tombstone takes its place (IDEM-STORE-9),
// when the retention ends the record goes. Sealing and opening are seal.js's, the same as
// every sealed store's.
//
// The limits are the MemoryStore's (IDEM-STORE-3): a new claim past them sweeps what is due
// and, if still past, is refused; writes to existing records are always taken; no live
// record is evicted. Each write first sweeps up to 32 due records.
import { memoryAccounting, responseApart } from "./idem_wasm.js";
import { openedRecord } from "./seal.js";
import { StoreFullError } from "./util.js";

/** Bytes counted per record beyond its key and sealed bytes, and the due records a write
 * expires before it is applied: idem-core's, as the module's MemoryStore counts (read from
 * the module once it is ready, by the first sealed store). */
let ENTRY_OVERHEAD;
let SWEEP_PER_WRITE;

export class SealedRecords {
  /** Storage key → `{ version, value, held, heldUntil, expires }`. */
  #map = new Map();
  /** `[at, key]` by `at`: at least one per record at its deadline; others are stale. */
  #due = [];
  #seal;
  #maxEntries;
  #maxBytes;
  #bytes = 0;
  #expired = 0;

  constructor(maxEntries, maxBytes, seal) {
    if (ENTRY_OVERHEAD === undefined) [ENTRY_OVERHEAD, SWEEP_PER_WRITE] = memoryAccounting();
    this.#maxEntries = maxEntries;
    this.#maxBytes = maxBytes;
    this.#seal = seal;
  }

  /** Records held. */
  get size() {
    return this.#map.size;
  }

  /** Bytes held, as counted against the byte limit. */
  get bytes() {
    return this.#bytes;
  }

  /** Records expired so far. */
  get expired() {
    return this.#expired;
  }

  /** The earliest deadline of any record, or undefined. */
  get nextDeadline() {
    while (this.#due.length > 0) {
      const [at, key] = this.#due[0];
      if (deadline(this.#map.get(key)) === at) return at;
      pop(this.#due);
    }
    return undefined;
  }

  /** Replaces the sealer: the keys rotate, the records stay. */
  set seal(seal) {
    this.#seal = seal;
  }

  /** The sealed bytes under `key`, or undefined. */
  stored(key) {
    return this.#map.get(key)?.value;
  }

  async load(key) {
    const e = this.#map.get(key);
    if (e === undefined) return null;
    const { version, value } = e;
    return { version, value: await openedRecord(this.#seal, key, value) };
  }

  async apply(key, write, now) {
    let put = null;
    if (write.value !== null) {
      const seal = this.#seal;
      const held = write.deadline < write.expires ? responseApart(write.value) : undefined;
      const [value, tombstone] = await Promise.all([seal.seal(key, write.value), held === undefined ? null : seal.seal(key, held)]);
      put = { version: String(write.version), value, held: tombstone, heldUntil: write.deadline, expires: write.expires };
    }
    // From here to the end, one step: nothing else runs between the check and the write.
    this.sweep(now, SWEEP_PER_WRITE);
    const current = this.#map.get(key);
    const expect = write.expect ?? null;
    if (expect === null ? current !== undefined : current?.version !== String(expect)) return false;
    if (put === null) {
      if (current !== undefined) this.#remove(key, current);
      return true;
    }
    const bytes = size(key, put);
    if (current === undefined && this.#isFull(bytes)) {
      this.sweep(now);
      if (this.#isFull(bytes)) throw new StoreFullError(`idempotency store full (${this.#map.size} records)`);
    }
    if (current !== undefined) this.#bytes -= size(key, current);
    this.#bytes += bytes;
    this.#map.set(key, put);
    if (deadline(put) !== deadline(current)) push(this.#due, [deadline(put), key]);
    return true;
  }

  /** Expires up to `budget` records due at `now` without opening any; returns how many
   * changed. */
  sweep(now, budget = Infinity) {
    let done = 0;
    while (done < budget && this.#due.length > 0 && this.#due[0][0] <= now) {
      const [at, key] = pop(this.#due);
      const e = this.#map.get(key);
      if (deadline(e) !== at) continue;
      if (e.held !== null) {
        this.#bytes -= e.value.byteLength;
        e.value = e.held;
        e.held = null;
        push(this.#due, [e.expires, key]);
      } else {
        this.#remove(key, e);
      }
      this.#expired++;
      done++;
    }
    return done;
  }

  #remove(key, e) {
    this.#map.delete(key);
    this.#bytes -= size(key, e);
  }

  #isFull(extra) {
    return this.#map.size >= this.#maxEntries || this.#bytes + extra > this.#maxBytes;
  }
}

const deadline = (e) => (e === undefined ? undefined : e.held !== null ? e.heldUntil : e.expires);
const size = (key, e) => key.length + e.value.byteLength + (e.held?.byteLength ?? 0) + ENTRY_OVERHEAD;

// A binary min-heap of `[at, key]` on `at`.
function push(heap, item) {
  let i = heap.push(item) - 1;
  while (i > 0) {
    const parent = (i - 1) >> 1;
    if (heap[parent][0] <= item[0]) break;
    heap[i] = heap[parent];
    i = parent;
  }
  heap[i] = item;
}

function pop(heap) {
  const top = heap[0];
  const last = heap.pop();
  if (heap.length > 0) {
    let i = 0;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= heap.length) break;
      const c = l + 1 < heap.length && heap[l + 1][0] < heap[l][0] ? l + 1 : l;
      if (heap[c][0] >= last[0]) break;
      heap[i] = heap[c];
      i = c;
    }
    heap[i] = last;
  }
  return top;
}
