// Types of `idem/redis`.
import type { IdempotencyStore, SealOptions, StoreWrite, StoredRecord } from "idem";

/** The ioredis methods the store uses (a `Redis` or a `Cluster`). */
export interface RedisLike {
  hmgetBuffer(key: string, ...fields: string[]): Promise<(Buffer | null)[]>;
  defineCommand(name: string, definition: { numberOfKeys: number; lua: string }): void;
}

/** A store on Redis or Valkey: one hash per record, written by one Lua compare-and-set
 * script, with the record's key expiry as its time-to-live. */
export class RedisStore implements IdempotencyStore {
  /** `timeout`: how long one call may take, in milliseconds (default `storeTimeoutMs()`,
   * 2000); a call Redis does not answer by then fails (code `IDEM-STORE-4`), and the request
   * is answered 503. `seal`: seal every record written with the first key (AES-256-GCM,
   * WebCrypto) and open records sealed with any of them (IDEM-SEAL-1, IDEM-SEAL-2); a record
   * none opens is answered 500 `record-sealed` and never executed (IDEM-SEAL-3). */
  constructor(redis: RedisLike, options?: { prefix?: string; timeout?: number; seal?: SealOptions });
  /** The Redis key of a storage key: `<prefix>{<storage key>}`. */
  redisKey(key: string): string;
  load(key: string): Promise<StoredRecord | null>;
  apply(key: string, write: StoreWrite, now: number): Promise<boolean>;
}
