// Hand-written types of `idem/client`: `idempotentFetch`, on the client's own WebAssembly
// module. `npm run typecheck` compiles types/check.ts against this file.

/** Whole milliseconds. */
type Millis = number;

/** Where pending client entries are kept between sends (localStorage, a file, a table). */
export interface OutboxPersistence {
  load(id: string): Promise<Uint8Array | null | undefined> | Uint8Array | null | undefined;
  save(id: string, entry: Uint8Array): Promise<void> | void;
  delete(id: string): Promise<void> | void;
}

export interface IdempotentFetchOptions {
  /** Use this key instead of generating one. */
  key?: string;
  /** The generated key's UUID version (default 4). */
  keyVersion?: 4 | 7;
  /** How the key is written: an RFC 8941 sf-string (`"…"`, default) or bare. */
  keyFormat?: "sf-string" | "bare";
  /** The kind of key generated: a UUID (default), the client's timestamp (`[clientId:]ms`,
   * taken once, sent bare) or the next number of a counter session (`client:epoch:seq`,
   * sent bare, with `Idempotency-Low-Water`). */
  keyKind?: "uuid" | "unix-time" | "counter";
  /** `keyKind: "unix-time"`: this client's id in the key. */
  clientId?: string;
  /** `keyKind: "counter"`: the session the server opened (its epoch as decimal text), the
   * counters' width (default 32) and first number (default 0). Each epoch has its own
   * numbering (sessions on several routes, a session opened again); a client's numberings
   * are kept in `persist` under `idem-counter:<client>`, so a restarted client continues
   * them and never reuses a number the server may still hold. */
  counter?: { client: string; epoch: string | bigint; bits?: number; firstSeq?: number | bigint | string };
  /** Backoff with full jitter: first ceiling `base` (default 200 ms), at most `cap`
   * (20 s), at most `maxAttempts` sends (10), within `deadline` of the first send (10 min). */
  retry?: { base?: Millis; cap?: Millis; maxAttempts?: number; deadline?: Millis };
  /** Saves the entry before every send; with `id`, a restart resumes with the same key. */
  persist?: OutboxPersistence;
  /** The logical request's id under which `persist` keeps its entry. Calls in this process
   * with the same `persist` and `id` while one runs are that one request: they join it and
   * resolve to its result, each with a response of its own, and send nothing (IDEM-JS-9). */
  id?: string;
  /** Whether an attempt that ends without an answer asks the server what became of its key
   * (default true): after the retry budget or deadline, and when an entry is resumed after a
   * restart. See `reconcile`. */
  reconcile?: boolean;
  /** Not an option: the signal is `init.signal` (or the input Request's), as for `fetch`.
   * Given here, the call is refused (`IDEM-JS-1`). */
  signal?: never;
  /** The `fetch` each attempt goes through (default: the global one), called with the URL
   * and every option of `init` (and of an input Request). */
  fetch?: typeof fetch;
  now?: () => number;
}

/** Why an entry gave up without a definite answer. */
export type GiveUpReason = "deadline" | "budget" | "key-forgotten" | "interrupted" | "refused";

export type IdempotentFetchResult =
  | { outcome: "completed" | "rejected"; key: string; attempts: number; status: number; response?: Response }
  | { outcome: "failed" | "undetermined"; key: string; attempts: number; status?: number; reason?: GiveUpReason }
  | { outcome: "executed"; key: string; attempts: number; status?: number }
  | { outcome: "not-executed"; key: string; attempts: number };

/** `fetch` with an Idempotency-Key kept across retries, driven by the core's client state
 * machine. An attempt that ends without an answer (the budget spent, a restart) asks the
 * server what became of its key with a settling status query: `completed` (the replay
 * fetched with the same key), `executed` (it ran; the response is gone), `not-executed`
 * (settled: it never ran and never will; send again under a new key), or `undetermined` (some
 * attempt may have been processed and the server could not say; a persisted entry is kept
 * for the next call with its `id`). Every attempt is sent
 * with all of `init`'s options (`credentials`, `mode`, `keepalive`, the runtime's own …) and
 * an input Request's. When `init.signal` (or the input Request's signal) aborts, nothing
 * more is sent and the promise rejects at once with the signal's reason (an `AbortError`
 * unless given another); an entry in `persist` is kept, so that the same `id` resumes with
 * the same key. */
export function idempotentFetch(
  input: RequestInfo | URL,
  init?: RequestInit,
  options?: IdempotentFetchOptions,
): Promise<IdempotentFetchResult>;

/** Asks what became of the request persisted under `options.id`, without sending it again
 * (its payload is gone): `input` and `init` are the original's URL, method and headers (its
 * credentials). Resolves to `executed`, `not-executed` or `undetermined` (the entry kept), an
 * entry already over to its outcome, and `null` when nothing is persisted under `id`. */
export function reconcile(
  input: RequestInfo | URL,
  init: RequestInit | undefined,
  options: Omit<IdempotentFetchOptions, "reconcile" | "persist" | "id"> & { persist: OutboxPersistence; id: string },
): Promise<IdempotentFetchResult | null>;
