// Counter keys (`keyKind: "counter"`): each client's numbering, run in the full client module.
// Every entry but the browsers' bundles this file with that module at hand; a browser page
// loads it with the full module (client-loader.js), only when it sends counter keys.
import * as ClientOp from "./client-codes/op.js";
import { run } from "./outbox.js";

/** One client's numbering, as its bytes and its session `epoch`. */
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

  /** The answer for number `seq` (decimal text) arrived. */
  done(seq) {
    [this.bytes] = run(ClientOp.CounterDone, this.bytes, seq);
  }

  lowWater() {
    return run(ClientOp.CounterLowWater, this.bytes)[0];
  }
}

/**
 * The counter sequences of this process, one per client: loaded from `persist` once, changed
 * one call at a time (two requests never take the same number), saved after every change.
 */
const sequences = new Map();

function sequenceId(client) {
  return `idem-counter:${client}`;
}

/** Runs `change(sequence)` on the sequence of `counter.client` (the options' `counter`), one
 * call at a time, and saves it; a new session `epoch` starts a new numbering, `bits` wide,
 * from `firstSeq` (IDEM-CTR-1). Bytes that are not a numbering are refused (IDEM-JS-2). */
export function withSequence(counter, persist, change) {
  const client = counter.client;
  let slot = sequences.get(client);
  if (slot === undefined) {
    slot = { sequence: null, chain: Promise.resolve() };
    sequences.set(client, slot);
  }
  const result = slot.chain.then(async () => {
    const epoch = String(counter.epoch);
    if (slot.sequence === null && persist) {
      const saved = await persist.load(sequenceId(client));
      if (saved != null) slot.sequence = new CounterSequence(run(ClientOp.CounterRestore, saved));
    }
    if (slot.sequence === null || slot.sequence.epoch !== epoch) {
      const bits = Number(counter.bits ?? 32);
      slot.sequence = new CounterSequence(run(ClientOp.CounterNew, client, epoch, bits, String(counter.firstSeq ?? 0)));
    }
    const value = change(slot.sequence);
    if (persist) await persist.save(sequenceId(client), slot.sequence.bytes);
    return value;
  });
  slot.chain = result.catch(() => {});
  return result;
}
