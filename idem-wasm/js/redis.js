// `idem/redis`: a store on Redis or Valkey, shared by every process that talks to it.
//
// Each record is one hash (`v`: its version, `r`: its bytes) under `<prefix>{<storage key>}`
// (idem-core's names for a record's Redis keys, shared with the Rust store):
// the braces are a hash tag, so that whatever else a record ever needs stays in its slot of
// a cluster. Writes are one Lua script (idem-core/stores/redis-apply.lua, shared with the
// Rust store), so the version check and the write are one step. The record's time-to-live
// is its key's expiry (or its live lease's end), from `write.expires`: never the response's,
// which would make the key new again and let a retry run twice (IDEM-TTL-3). A completed
// record's response is kept apart, under the record's key and `:response`, and expires with
// the response (IDEM-STORE-9): its bytes are gone from Redis when the response retention
// ends, while the key's tombstone stays. Reads are one script too (redis-load.lua).
import { StoreFullError, recordSealer, redisKeys, responseApart, storeTimeoutMs } from "idem";
import APPLY from "../../idem-core/stores/redis-apply.lua";
import LOAD from "../../idem-core/stores/redis-load.lua";
import { bounded, milliseconds, rangeError } from "./errors.js";

const SCRIPT = "idemApply";
/** The script for a new record: without its first line, the flags that let a write to an
 * existing record through when Redis is at `maxmemory` (IDEM-STORE-3). */
const NEW = "idemApplyNew";
const READ = "idemLoad";

export class RedisStore {
  #redis;
  #prefix;
  #timeout;
  #seal;

  /**
   * @param redis an ioredis `Redis` or `Cluster`
   * @param options `{ prefix, timeout, seal }`: what every record key starts with (default
   * `"idem:"`); how long one call may take in milliseconds (default idem-core's, 2000): a
   * call Redis does not answer by then fails, and the request is answered 503; and
   * `{ keys: [{ id, key }, …] }` to seal every record written with the first key (AES-256-GCM)
   * and open records sealed with any (IDEM-SEAL-1, IDEM-SEAL-2)
   */
  constructor(redis, { prefix, timeout, seal } = {}) {
    if (redis == null || typeof redis.hmgetBuffer !== "function" || typeof redis.defineCommand !== "function") {
      throw rangeError("IDEM-JS-1", "RedisStore needs an ioredis client (new Redis(url) or new Redis.Cluster(nodes))");
    }
    if (prefix !== undefined && typeof prefix !== "string") throw rangeError("IDEM-JS-1", "options.prefix must be a string");
    this.#redis = redis;
    this.#prefix = prefix;
    this.#timeout = milliseconds(timeout, storeTimeoutMs(), "options.timeout");
    this.#seal = recordSealer(seal);
    // ioredis sends the scripts by their SHA-1 and loads them on the server when missing.
    if (typeof redis[SCRIPT] !== "function") redis.defineCommand(SCRIPT, { numberOfKeys: 2, lua: APPLY });
    if (typeof redis[NEW] !== "function") redis.defineCommand(NEW, { numberOfKeys: 2, lua: APPLY.slice(APPLY.indexOf("\n") + 1) });
    if (typeof redis[READ] !== "function") redis.defineCommand(READ, { numberOfKeys: 2, lua: LOAD });
  }

  /** The Redis key of a storage key's record. */
  redisKey(key) {
    return redisKeys(this.#prefix, key)[0];
  }

  async load(key) {
    const [record, response] = redisKeys(this.#prefix, key);
    const found = await bounded(this.#redis[`${READ}Buffer`](record, response), this.#timeout, "Redis");
    if (found === null) return null;
    const [version, stored] = found;
    const value = new Uint8Array(stored.buffer, stored.byteOffset, stored.byteLength);
    return { version: version.toString("latin1"), value: this.#seal === null ? value : await this.#seal.open(key, value) };
  }

  async apply(key, write, _now) {
    const [record, response] = redisKeys(this.#prefix, key);
    const put = write.value !== null;
    // A completed record whose response expires before it (`deadline` < `expires`): the
    // record without its response is kept for the key's retention, the whole record until
    // the response expires.
    const held = put && write.deadline < write.expires ? responseApart(write.value) : undefined;
    const sealed = (bytes) => (this.#seal === null ? bytes : this.#seal.seal(key, bytes));
    const whole = put ? await sealed(write.value) : null;
    const kept = held !== undefined ? await sealed(held) : whole;
    const applied = this.#redis[write.expect === null ? NEW : SCRIPT](
      record,
      response,
      write.expect ?? "",
      put ? write.version : "",
      put ? buffer(kept) : "",
      put ? String(Math.ceil(write.expires)) : "0",
      held !== undefined ? buffer(whole) : "",
      held !== undefined ? String(Math.ceil(write.deadline)) : "0",
    );
    try {
      return (await bounded(applied, this.#timeout, "Redis")) === 1;
    } catch (err) {
      // At `maxmemory` under `noeviction`, Redis refuses writes: the store is full (503
      // store-full, IDEM-STORE-3), not gone.
      if (typeof err?.message === "string" && err.message.startsWith("OOM ")) throw new StoreFullError(`Redis is full: ${err.message}`);
      throw err;
    }
  }
}

const buffer = (v) => Buffer.from(v.buffer, v.byteOffset, v.byteLength);
