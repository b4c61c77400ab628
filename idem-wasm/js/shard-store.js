// `DurableObjectStore`, the store a worker passes to `withIdempotency`: it sends each key's
// claims, reads and compare-and-sets to the `IdempotencyShard` object that owns the key
// (shard.js), in the messages of shard-wire.js. Which object owns a key is decided here, from
// the key alone (the placement).
import { MAX_VALUE_BYTES } from "./shard.js";
import { SHARD_ORIGIN, applyRequest, claimRequest, failureOf, loadRequest, readApplied, readClaimed, readLoaded } from "./shard-wire.js";
import { bounded, milliseconds } from "./errors.js";
import { storeTimeoutMs } from "./idem_wasm.js";
import { rangeError } from "./util.js";

/**
 * Shards a storage key belongs to. Fixed, so that the placement of a key never changes: not
 * with a setting, not between two versions of a worker deployed at once. A retry must reach
 * the object that saw its key (IDEM-EXEC-1).
 */
export const PLACEMENT_SHARDS = 256;

/** FNV-1a over the key's UTF-16 code units: a stable shard index. */
export function shardOf(key) {
  let h = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) {
    h ^= key.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h % PLACEMENT_SHARDS;
}

/** The name of the object that owns a storage key. */
export function shardName(key) {
  return `idem-${shardOf(key)}`;
}

/**
 * The store a worker passes to `withIdempotency`: each key belongs to one of a fixed set of
 * `IdempotencyShard` objects, chosen from the key alone, which makes its claims.
 */
export class DurableObjectStore {
  #namespace;
  #timeout;

  /** The largest response a shard keeps (IDEM-STORE-5): its record, with the request's
   * fingerprint and the response's headers, still fits in `MAX_VALUE_BYTES`. */
  maxResponseBytes = MAX_VALUE_BYTES - 64 * 1024;

  /** `options.timeout`: how long one call of a shard may take in milliseconds (default
   * idem-core's, 2000). Nothing else: the shard of a key is fixed. */
  constructor(namespace, options) {
    if (namespace == null || typeof namespace.idFromName !== "function" || typeof namespace.get !== "function") {
      throw rangeError("IDEM-JS-1", "DurableObjectStore needs a Durable Object namespace binding");
    }
    const { timeout, ...rest } = options ?? {};
    if (Object.keys(rest).length > 0) {
      throw rangeError(
        "IDEM-JS-1",
        "DurableObjectStore takes no options but timeout: the shard of a key is fixed, so that a change of settings or a deploy never sends a retry to an object that did not see its key",
      );
    }
    this.#namespace = namespace;
    this.#timeout = milliseconds(timeout, storeTimeoutMs(), "options.timeout");
  }

  #stub(key) {
    return this.#namespace.get(this.#namespace.idFromName(shardName(key)));
  }

  /** One call of the shard that owns `key`, bounded in time as every store call is
   * (IDEM-STORE-10: `options.timeout`): an object that does not answer (stuck, overloaded,
   * its storage slow) is a store failure, never a wait without end. */
  async #call(key, { path, headers, body }) {
    const sent = this.#stub(key).fetch(`${SHARD_ORIGIN}${path}`, { method: "POST", headers, body });
    const response = await bounded(sent, this.#timeout, "the idempotency shard");
    if (!response.ok && response.status !== 404) throw await failureOf(response);
    return response;
  }

  async claim(key, ticket, optionsText, now, hi, lo) {
    return readClaimed(await this.#call(key, claimRequest(ticket, optionsText, now, hi, lo)));
  }

  async load(key) {
    return readLoaded(await this.#call(key, loadRequest(key)));
  }

  async apply(key, write, now) {
    return readApplied(await this.#call(key, applyRequest(key, write, now)));
  }
}
