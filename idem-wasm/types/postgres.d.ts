// Types of `idem/postgres`.
import type { IdempotencyContext, IdempotencyStore, SealOptions, StoreWrite, StoredRecord } from "idem";

/** The pg methods the store uses (a `Pool`). `connect` in its callback form: the store
 * watches a client for errors from the moment the pool hands it over. */
export interface PoolLike {
  query(query: string | { name?: string; text: string; values?: unknown[] }): Promise<{ rows: any[]; rowCount: number | null }>;
  connect(callback: (err: Error | undefined, client: ClientLike | undefined) => void): void;
}

/** A client of the pool: checked out for each statement, and held for a transaction. */
export interface ClientLike {
  query(query: string | { name?: string; text: string; values?: unknown[] }, values?: unknown[]): Promise<{ rows: any[]; rowCount: number | null }>;
  release(err?: unknown): void;
}

/** A store on Postgres: one table, `idem_records`; claims by `INSERT … ON CONFLICT DO
 * NOTHING`, other writes by `UPDATE`/`DELETE … WHERE version = $n`. */
export class PostgresStore<C extends ClientLike = ClientLike> implements IdempotencyStore {
  /** `timeout`: how long one call may take, in milliseconds (default `storeTimeoutMs()`,
   * 2000); a call Postgres does not answer by then fails (code `IDEM-STORE-4`), and the
   * request is answered 503. `seal`: seal every record written with the first key (AES-256-GCM, WebCrypto) and open
   * records sealed with any of them (IDEM-SEAL-1, IDEM-SEAL-2); a record none opens is
   * answered 500 `record-sealed` and never executed (IDEM-SEAL-3), and the sweep leaves it
   * alone. */
  constructor(pool: PoolLike, options?: { timeout?: number; seal?: SealOptions });
  /** The migration: the table and its deadline index (safe to run again). */
  static readonly schema: string;
  /** Runs the migration. */
  migrate(): Promise<void>;
  load(key: string): Promise<StoredRecord | null>;
  apply(key: string, write: StoreWrite, now: number, info?: { outcome: "answered" | "threw" }): Promise<boolean>;
  /** Runs `fn(client)` in a transaction that commits with the request's completion: the
   * handler's rows and the stored response, both or neither. */
  transaction<T>(context: IdempotencyContext, fn: (client: C) => Promise<T>): Promise<T>;
  /** Expires what is due at `now` (at most `limit` records); resolves to how many changed. */
  sweep(now?: number, limit?: number): Promise<number>;
}
