// `idem/redis`: a store on Redis or Valkey, shared by every process that talks to it.
//
// Each record is one hash (`v`: its version, `r`: its bytes) under `<prefix>{<storage key>}`:
// the braces are a hash tag, so that whatever else a record ever needs stays in its slot of
// a cluster. Writes are one Lua script (idem-core/stores/redis-apply.lua, shared with the
// Rust store), so the version check and the write are one step. The record's time-to-live
// is its key's expiry (or its live lease's end), from `write.expires`: never the response's,
// which would make the key new again and let a retry run twice (IDEM-TTL-3). A response
// past its expiry stays in the hash until then; the engine answers 410 from it.
import APPLY from "../../idem-core/stores/redis-apply.lua";
import { rangeError } from "./errors.js";

const SCRIPT = "idemApply";

/**
 * A store on Redis or Valkey through an ioredis client (a `Redis`, or a `Cluster`). The
 * client is the caller's: it is neither connected nor closed here.
 */
export class RedisStore {
  #redis;
  #prefix;

  /**
   * @param redis an ioredis `Redis` or `Cluster`
   * @param options `{ prefix }`: what every record key starts with (default `"idem:"`)
   */
  constructor(redis, { prefix = "idem:" } = {}) {
    if (redis == null || typeof redis.hmgetBuffer !== "function" || typeof redis.defineCommand !== "function") {
      throw rangeError("IDEM-JS-1", "RedisStore needs an ioredis client (new Redis(url) or new Redis.Cluster(nodes))");
    }
    if (typeof prefix !== "string") throw rangeError("IDEM-JS-1", "options.prefix must be a string");
    this.#redis = redis;
    this.#prefix = prefix;
    // ioredis sends the script by its SHA-1 and loads it on the server when missing.
    if (typeof redis[SCRIPT] !== "function") redis.defineCommand(SCRIPT, { numberOfKeys: 1, lua: APPLY });
  }

  /** The Redis key of a storage key. */
  redisKey(key) {
    return `${this.#prefix}{${key}}`;
  }

  async load(key) {
    const [version, value] = await this.#redis.hmgetBuffer(this.redisKey(key), "v", "r");
    if (version === null || value === null) return null;
    return { version: version.toString("latin1"), value: new Uint8Array(value.buffer, value.byteOffset, value.byteLength) };
  }

  async apply(key, write, _now) {
    const put = write.value !== null;
    const done = await this.#redis[SCRIPT](
      this.redisKey(key),
      write.expect ?? "",
      put ? write.version : "",
      put ? Buffer.from(write.value.buffer, write.value.byteOffset, write.value.byteLength) : "",
      put ? String(Math.ceil(write.expires)) : "0",
    );
    return done === 1;
  }
}
