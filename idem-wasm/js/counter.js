// Counter keys (`keyKind: "counter"`): each client's numberings, run in the full client module.
// Every entry but the browsers' bundles this file with that module at hand; a browser page
// loads it with the full module (client-loader.js), only when it sends counter keys.
import * as ClientOp from "./client-codes/op.js";
import { rangeError } from "./errors.js";
import { run } from "./outbox.js";

/** One client's numbering in one session epoch, as its bytes and its `epoch` (decimal text,
 * as the module writes it). */
class CounterSequence {
  constructor([bytes, epoch]) {
    this.bytes = bytes;
    this.epoch = epoch;
  }

  /** The key of a new logical request, with the next number. */
  takeKey() {
    const [bytes, key] = run(ClientOp.CounterTake, this.bytes);
    this.bytes = bytes;
    return key;
  }

  /** The answer for the request of `key` (`client:epoch:seq`, one of this numbering's)
   * arrived. */
  done(key) {
    [this.bytes] = run(ClientOp.CounterDone, this.bytes, key.slice(key.lastIndexOf(":") + 1));
  }

  lowWater() {
    return run(ClientOp.CounterLowWater, this.bytes)[0];
  }

  /** Whether none of its numbers waits for its answer. */
  idle() {
    return run(ClientOp.CounterLowWater, this.bytes)[1] === 0;
  }
}

/**
 * The counter numberings of this process, one per client and session epoch: loaded from
 * `persist` once per client, changed one call at a time per client (two requests never take
 * the same number), saved after every change.
 */
const sequences = new Map();

/** The Web Locks of this origin (browsers, in secure contexts): the pages and workers of an
 * origin share its storage, so a `persist` over IndexedDB is one record for all of them.
 * With them, each change runs under the client's lock and reads the record again, so that
 * two tabs never take the same number (a second request under a key that another tab's
 * request had would get that request's answer). A `persist` over `localStorage` cannot be
 * shared so: a page's read of it may miss another page's last write, lock or not. */
const locks = globalThis.navigator?.locks;

/** Where `persist` keeps the numberings of `client`: one record, each epoch's numbering's
 * bytes one after the other. */
function sequenceId(client) {
  return `idem-counter:${client}`;
}

/** The numberings of a record, by epoch. Each is written as the module writes it, so that
 * the next one starts where it ends; a record of one numbering is what earlier versions
 * wrote. Bytes that are not numberings are refused (IDEM-JS-2). */
function fromRecord(bytes) {
  const all = new Map();
  let at = 0;
  do {
    const rest = bytes.subarray(at);
    const sequence = new CounterSequence(run(ClientOp.CounterRestore, rest));
    if (!sequence.bytes.every((b, i) => b === rest[i])) throw rangeError("IDEM-JS-2", "malformed counter sequence");
    all.set(sequence.epoch, sequence);
    at += sequence.bytes.length;
  } while (at < bytes.length);
  return all;
}

function toRecord(all) {
  const parts = [...all.values()].map((s) => s.bytes);
  const out = new Uint8Array(parts.reduce((n, b) => n + b.length, 0));
  let at = 0;
  for (const b of parts) {
    out.set(b, at);
    at += b.length;
  }
  return out;
}

/** How far apart two epochs of one session may be. Opening a live session again moves it to
 * the next epoch (IDEM-CTR-5), and a new session takes a random 63-bit one (IDEM-CTR-3):
 * another session's epoch falls this close with a chance of about 2^-47. */
const SAME_SESSION = 1n << 16n;

/** Drops the numberings whose session moved on: none of their numbers waits for an answer
 * and a later epoch of the same session is in use. A request still made with such an epoch
 * is refused by the server (412 stale-epoch): nothing runs and nothing is replayed, whatever
 * its number (IDEM-CTR-4, IDEM-CTR-5). */
function prune(all) {
  const epochs = [...all.keys()].map(BigInt);
  for (const [text, sequence] of all) {
    const epoch = BigInt(text);
    if (epochs.some((e) => e > epoch && e - epoch <= SAME_SESSION) && sequence.idle()) all.delete(text);
  }
}

/** Runs `change(sequence)` on the numbering of `counter.client` (the options' `counter`) in
 * the epoch of `key` when it is one of that client's keys (a request's own key:
 * `client:epoch:seq`), otherwise in `counter.epoch`, one call at a time (in a browser, one
 * call at a time of all the origin's pages, under the client's Web Lock), and saves it. Each
 * epoch has its own numbering: a call with another epoch never changes this one's. An epoch
 * without one starts it, `bits` wide, from `firstSeq` (IDEM-CTR-1). Bytes that are not
 * numberings are refused (IDEM-JS-2). */
export function withSequence(counter, persist, change, key) {
  const client = counter.client;
  const parts = key?.split(":");
  const epoch = parts?.length === 3 && parts[0] === client ? parts[1] : String(counter.epoch);
  let slot = sequences.get(client);
  if (slot === undefined) {
    slot = { all: null, chain: Promise.resolve() };
    sequences.set(client, slot);
  }
  const shared = persist && locks !== undefined;
  const step = async () => {
    if (slot.all === null || shared) {
      const saved = persist ? await persist.load(sequenceId(client)) : null;
      slot.all = saved == null ? new Map() : fromRecord(saved);
    }
    let sequence = slot.all.get(epoch);
    if (sequence === undefined) {
      const bits = Number(counter.bits ?? 32);
      const fresh = new CounterSequence(run(ClientOp.CounterNew, client, epoch, bits, String(counter.firstSeq ?? 0)));
      // The epoch as the module writes it ("07" is 7): one numbering per epoch.
      sequence = slot.all.get(fresh.epoch) ?? fresh;
      slot.all.set(sequence.epoch, sequence);
    }
    const value = change(sequence);
    prune(slot.all);
    if (persist) await persist.save(sequenceId(client), toRecord(slot.all));
    return value;
  };
  const result = slot.chain.then(() => (shared ? locks.request(sequenceId(client), step) : step()));
  slot.chain = result.catch(() => {});
  return result;
}
