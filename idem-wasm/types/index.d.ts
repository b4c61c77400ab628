// Hand-written types of the idem package. `npm run typecheck` compiles
// types/check.ts against this file.

/** Durations are whole milliseconds. */
export type Millis = number;

/** How keys are parsed: an RFC 8941 sf-string only (`opaque-strict`), an sf-string or a
 * Stripe-style bare key (`opaque`, the default), or a UUID (any version, v4 or v7). */
/** The key a request carries: opaque (sf-string or bare), a UUID, a client timestamp
 * (`[client:]millis`), a wrapping counter (`client:epoch:seq`) or a server-issued token. */
export type KeyKind =
  | "opaque"
  | "opaque-strict"
  | "uuid"
  | "uuid-v4"
  | "uuid-v7"
  | "unix-time"
  | "counter"
  | "token";

/** What happens after an unknown outcome (a thrown handler, a 5xx): re-execute with
 * `recovered: true` (default), store and replay the response, or hold the key (409). */
export type UnknownOutcomePolicy = "reexecute" | "store" | "hold";

/** What goes into the request fingerprint. */
export interface FingerprintOptions {
  /** Header names whose values are part of the fingerprint. */
  headers?: string[];
  /** Volatile JSON fields removed before hashing, as JSON Pointers (`*` matches any member). */
  exclude?: string[];
  /** When the body is canonicalised as JSON; `auto` (default) follows Content-Type. */
  json?: "auto" | "always" | "never";
  /** The largest body accepted, in bytes (default 1 MiB); larger bodies get 413. */
  maxBody?: number;
}

/** A record as a store keeps it. Versions are decimal strings (u64 values). */
export interface StoredRecord {
  version: string;
  value: Uint8Array;
}

/** A compare-and-set write: apply it only if the stored record's version equals `expect`
 * (or, when `expect` is null, only if there is no record). `value: null` deletes. */
export interface StoreWrite {
  expect: string | null;
  value: Uint8Array | null;
  version: string;
  /** When the record next changes on its own (ms since the epoch; 0 for a delete): when to
   * sweep it (see `expire`). */
  deadline: number;
  /** Until when the record must be kept (ms since the epoch; 0 for a delete): its key's
   * expiry, or its live lease's end if later. A store's own time-to-live comes from here,
   * never from `deadline`: a record deleted when its response expires lets a retry run again
   * (IDEM-TTL-3). */
  expires: number;
  /** True on a completion that stores the handler's response, as the engine decided it. A
   * store that commits the handler's own writes with its completion commits them only then:
   * never with a release or an outcome held as unknown (IDEM-STORE-7). */
  storesResponse: boolean;
  /** True when the record written is in flight: a claim, a heartbeat, or an attempt that
   * threw left for a retry to take over. A store that holds claims in memory may keep such a
   * record there while it stores none of the key (IDEM-STORE-8). */
  inFlight: boolean;
}

/** The write that applies the passage of time to a stored record at `now`: a tombstone in
 * place of an expired response, or a delete once the key (and any live lease) has ended;
 * undefined when nothing is due. Set `expect` to the stored version before applying it. */
export function expire(now: number, value: Uint8Array): StoreWrite | undefined;

/** For a store that deletes on a time-to-live: the record as it stands once its response has
 * expired (its tombstone, the same version), or undefined when it holds no response that
 * expires before it. Keep the response apart until the write's `deadline` and this until its
 * `expires` (IDEM-STORE-9). */
export function responseApart(value: Uint8Array): Uint8Array | undefined;

/** For a store that seals its records: what its sweep does with a due record it cannot open
 * (sealed under a key it does not hold, IDEM-SEAL-3), from the record's `expires`, which the
 * store keeps in clear beside it: undefined to delete it now (it need no longer be kept), or
 * the time it is due again, so that it does not stand in front of the records due behind it.
 * `PostgresStore`, `IdempotencyShard` and the Rust stores sweep by this rule. */
export function unopenedDue(now: number, expires: number): number | undefined;

/** How long one call to a network store may take unless its options say otherwise, in
 * milliseconds (idem-core's `CALL_TIMEOUT`): `RedisStore` and `PostgresStore` fail a call
 * their server does not answer by then, and the request is answered 503. */
export function storeTimeoutMs(): number;

/** The Redis keys `[record, response]` of a storage key under `prefix` (undefined: `idem:`):
 * the record's, `<prefix>{<storage key>}`, and its response's, kept apart while it lasts (the
 * same hash slot). Every Redis store names its keys so, the Rust one included. */
export function redisKeys(prefix: string | undefined, storageKey: string): [string, string];

/** The store contract (IDEM-STORE-1). `apply` resolves to false, changing nothing, when the
 * precondition fails. A store that cannot take a new key throws `StoreFullError`. Expiry is
 * the record's to say: never delete a record before its key expires, and never one in
 * flight whose lease is live (IDEM-STORE-3, IDEM-LEASE-4). */
export interface IdempotencyStore {
  load(key: string): Promise<StoredRecord | null> | StoredRecord | null;
  /** `info` is set on the write that records the handler's outcome: how the handler ended,
   * the fence of the attempt's lease, and the attempt's identity (every attempt at every key
   * has its own). A completion that loses its race may be made again by the same attempt. */
  apply(key: string, write: StoreWrite, now: number, info?: { outcome: "answered" | "threw"; fence: number; attempt: string }): Promise<boolean> | boolean;
  /** Called once the request of attempt `attempt` at `key` is over, however it ended: a store
   * that keeps something for the attempt (a handler's transaction) lets go of it, rolled back
   * unless its completion committed it (IDEM-STORE-7). Returns true when it let go of the
   * handler's writes uncommitted: the handler's response then does not go out (503). */
  end?(key: string, attempt: string): void | boolean | Promise<void | boolean>;
  /** Engine-side claim, for stores that claim next to their data (Durable Objects): the
   * request's ticket in, what was claimed out. */
  claim?(key: string, ticket: Uint8Array, options: string, now: number, nonceHi: number, nonceLo: number): Promise<Uint8Array>;
  /** The largest response the store keeps; a larger one is kept as a 410
   * response-not-stored answer, so that a retry never runs again (IDEM-STORE-5). */
  readonly maxResponseBytes?: number;
}

/** An event for logs and metrics: `executed`, `took-over`, `replayed`, `in-progress`,
 * `mismatch`, `tombstone-hit`, `outcome-unknown-hit`, `rejected`, `completed`, `released`,
 * `outcome-unknown`, `fenced-out`, `extended`. */
/** A span as a telemetry hook returns it (an OpenTelemetry `Span` is one). */
export interface TelemetrySpan {
  setAttribute(key: string, value: string | number): unknown;
  end(): void;
}

/** What records idem's telemetry (`options.telemetry`): the names it is given are
 * idem-core's, the same as the Rust tower layer's. */
export interface TelemetryHook {
  /** Opens the span of one operation (a guarded request, a status query, a token, a session,
   * an inbox delivery). */
  startSpan(name: string, attributes: Record<string, string | number>): TelemetrySpan;
  /** Runs `fn` with `span` as the active span (optional). */
  inSpan?<T>(span: TelemetrySpan, fn: () => T): T;
  /** Adds `n` to the counter `metric`. */
  count(metric: string, n: number, attributes: Record<string, string>): void;
  /** Records `value` (in `unit`) in the histogram `metric`. */
  record(metric: string, value: number, attributes: Record<string, string>, unit: string): void;
}

export interface IdempotencyEvent {
  name: string;
  /** The idempotency key, or null when the request was refused before it was parsed. */
  key: string | null;
  /** A tombstone hit, a mismatch or a fenced-out completion: log it as a security event. */
  securityRelevant: boolean;
  fence?: number;
  recovered?: boolean;
  /** The requirement ID of a refusal. */
  code?: string;
  error?: unknown;
}

export interface IdempotencyOptions<R = Request> {
  /** Where records live. */
  store: IdempotencyStore;
  /** Who sent the request: an account or user id, never a bearer token that rotates (a
   * refreshed token would split one user into two scopes and run a retry again), never a
   * header that may be missing. `"none"` for an API with a single tenant. Required; an empty
   * answer is refused with 500 no-principal (IDEM-SCOPE-3). Stored only as a digest. */
  principal: "none" | ((request: R) => string | Promise<string>);
  /** Whether guarded requests must carry a key (default) or pass through without one. */
  keys?: "required" | "optional";
  keyKind?: KeyKind;
  /** Where a guarded request without an Idempotency-Key header finds its key: `"derive"`
   * (from the caller, method, route and the fingerprinted body, `fingerprint.exclude`
   * leaving out volatile fields: a double submit is one request, and so is a deliberate
   * second identical one) or `{ jsonPointer }` (a string in the JSON body, for clients
   * behind proxies that drop headers). A key header always wins. Opaque and UUID keys only. */
  keyFallback?: "derive" | { jsonPointer: string };
  /** `keyKind: "unix-time"`: how far ahead of the server's clock a timestamp may be
   * (default 5 minutes) and how old it may be (default 24 h); `maxAge + maxAhead` must not
   * exceed `keyTtl`. With `clientHeader` (for example `"x-client-id"`), that header's value is
   * the client of a key that names none (`client:millis`), on requests and status queries. */
  timeKeys?: { maxAhead?: Millis; maxAge?: Millis; clientHeader?: string };
  /** `keyKind: "counter"`: the sequence number's width in bits, 8 to 64 (default 32), and
   * the window of retained results per client (default 8). */
  counter?: { bits?: number; window?: number };
  /** `keyKind: "token"`: the signing secret (32 random bytes as 64 hex digits, the same on
   * every instance) and how long an issued token stays valid (at most `keyTtl`). */
  token?: { secret: string; ttl: Millis };
  /** How long a completed response is replayed (default 24 h). */
  responseTtl?: Millis;
  /** How long a key is remembered, at least `responseTtl` (default 7 days). */
  keyTtl?: Millis;
  /** How long a claim lasts before another attempt may take over (default 60 s). */
  lease?: Millis;
  /** The longest Retry-After of an in-progress answer: the time left of the lease, capped
   * here (default 2 s, IDEM-CONC-4). */
  maxRetryAfter?: Millis;
  unknownOutcome?: UnknownOutcomePolicy;
  /** A duplicate of a request in flight: 409 with Retry-After (`reject`, default), or wait
   * up to `wait` ms for the first result, polling every `poll` ms (default 25). */
  inFlight?: "reject" | { wait: Millis; poll?: Millis };
  fingerprint?: FingerprintOptions;
  /** The largest response kept (default: what the store says, else 16 MiB less 64 KiB). */
  maxResponseBytes?: number;
  /** The route template for the scope (default: the URL path). */
  route?: (request: Request, url: URL) => string | Promise<string>;
  /** Guarded methods (default POST and PATCH); others pass through. */
  methods?: string[];
  onEvent?: (event: IdempotencyEvent) => void;
  /** Spans and metrics of every operation, under idem-core's names (docs/observability.md):
   * `openTelemetry()` of `idem/opentelemetry` builds one on `@opentelemetry/api`. */
  telemetry?: TelemetryHook;
  /** The clock (default Date.now). */
  now?: () => number;
  /** The header that carries the key (default `Idempotency-Key`). */
  keyHeader?: string;
  /** Maps a refusal (the engine's RFC 9457 problem: 400, 409, 410, 413, 422, 503, …) to
   * the host's own error format; replays and the handler's own answers are never mapped. */
  problem?: (problem: { type: string; title?: string; status: number; detail?: string; [member: string]: unknown }, reply: PlainReply) => Response;
  /** Whether the adapters answer status queries (default true): a `GET` with
   * `Idempotency-Status` is answered from the store with what became of its key, never by
   * the handler. */
  statusQueries?: boolean;
}

/** What a handler learns about the execution it runs. */
export interface IdempotencyContext {
  readonly key: string;
  /** True when this execution takes over from an attempt whose lease expired: reconcile
   * with whatever that attempt may have done before acting. */
  readonly recovered: boolean;
  readonly fence: number;
  readonly leaseExpires: number;
  /** The key of the request's record in the store (for `PostgresStore#transaction`). */
  readonly storageKey: string;
  /** This attempt's identity (16 hex digits), unique across every attempt at every key:
   * what a store keys something it keeps for the attempt by. */
  readonly attempt: string;
  /** A heartbeat: extends the lease by one lease period; rejects if it was taken over. */
  extend(): Promise<void>;
  /** `new Response(body, init)` that `withIdempotency` stores from the bytes given, without
   * reading its body back, and returns to the caller as it is (IDEM-JS-5): text, bytes
   * (copied now) or form parameters; a Blob or FormData is read back like any response's
   * body. A `ReadableStream` is read up to `maxResponseBytes`: a longer one is recorded as
   * too large to keep and sent on as it comes, at the pace the client reads (IDEM-STORE-5). */
  respond(body?: BodyInit | null, init?: ResponseInit): Response;
  /** `Response.json(value, init)`, stored as `respond` stores its body. */
  json(value: unknown, init?: ResponseInit): Response;
}

/** Wraps a Fetch handler with Idempotency-Key semantics. */
export function withIdempotency<Rest extends unknown[]>(
  handler: (request: Request, ...rest: Rest) => Response | Promise<Response>,
  options: IdempotencyOptions<Request> | Idempotency<Request>,
): (request: Request, ...rest: Rest) => Promise<Response>;

/** The context of a request that `withIdempotency` is executing (the request the handler
 * received), or undefined for requests that pass through. */
export function idempotencyOf(request: Request): IdempotencyContext | undefined;

/** A request as plain data, for hosts that are not Fetch-shaped. */
export interface PlainRequest {
  method: string;
  /** Path and query. */
  target: string;
  route?: string;
  /** The raw Idempotency-Key header value. */
  key: string | null | undefined;
  /** The raw Idempotency-Low-Water header value (counter keys). */
  lowWater?: string | null;
  contentType?: string | null;
  headers?: Headers | [string, string][] | Record<string, string | string[] | undefined>;
  /** The body: bytes or text. */
  body?: Uint8Array | ArrayBuffer | ArrayBufferView | string;
}

export interface PlainResponse {
  status: number;
  headers?: Headers | [string, string][] | Record<string, string | string[] | undefined>;
  /** The body: bytes or text; anything else is refused (IDEM-JS-1). */
  body?: Uint8Array | ArrayBuffer | ArrayBufferView | string;
  /** The body grew past `maxResponseBytes` and the caller sends it on itself as it is
   * produced (IDEM-STORE-5): it is recorded as too large to keep, and `body` is not read. */
  passThrough?: boolean;
}

export interface PlainReply {
  status: number;
  /** A flat [name, value, …] list. */
  headers: string[];
  body: Uint8Array;
  replayed: boolean;
  /** True for the answer of `run` (the handler ran), false for the engine's own (a replay
   * or a refusal). */
  executed: boolean;
  /** True when `run` answered `passThrough`: the caller sends the rest of its answer, and
   * `body` is null. */
  passThrough?: boolean;
}

/** The engine bound to a store; `withIdempotency` is built on it. */
/** `R` is what `options.principal` reads: a plain request for `handle`, or a Fetch
 * `Request` for an instance that `withIdempotency` serves. */
export class Idempotency<R = PlainRequest> {
  constructor(options: IdempotencyOptions<R>);
  /** Whether a request with this method (and a key, or not) is protected. */
  protects(method: string, hasKey: boolean): boolean;
  /** Whether a request with this method (and a key or not) needs its body to be identified:
   * it is protected and has a key, or its key would be derived from its body
   * (`keyFallback`). A host that reads bodies before its routing leaves the others unread. */
  readsBody(method: string, hasKey: boolean): boolean;
  handle(request: R & PlainRequest, run: (context: IdempotencyContext) => Promise<PlainResponse> | PlainResponse): Promise<PlainReply>;
  /** The `route` option. */
  readonly route: IdempotencyOptions["route"];
  /** The key header's name, lower case. */
  readonly keyHeader: string;
  /** The header of a counter client's low-water mark (`idempotency-low-water`, idem-core's
   * name), lower case: what an adapter passes as `lowWater`. */
  readonly lowWaterHeader: string;
  /** The field that makes a `GET` a status query (`idempotency-status`, idem-core's name),
   * lower case. */
  readonly statusHeader: string;
  /** The `statusQueries` option: whether adapters answer status queries. */
  readonly statusQueries: boolean;
  /** The largest response body the store keeps (IDEM-STORE-5): a host holds no more of an
   * answer than this, and passes a longer one through (`passThrough`). */
  readonly maxResponseBytes: number;
  /** Answers a status query given as plain data (IDEM-STATUS-1): `key` and `status` are the
   * raw `Idempotency-Key` and `Idempotency-Status` values (`POST`, or `POST; settle` to
   * settle a key never seen so that it never runs). 200 with the key's status document
   * (`application/vnd.idem.key-status+json`), in the asker's scope only, or the core's
   * problem. Nothing runs. `headers` are the request's: only `timeKeys.clientHeader` is read,
   * as for the request asked about. */
  status(input: R & { target: string; route?: string; key: string | null | undefined; status: string; headers?: Headers | [string, string][] | Record<string, string | string[] | undefined> }): Promise<PlainReply>;
  /** Opens the slot of a status query, for `serve`: the raw key and status field values, and
   * the request's headers (only `timeKeys.clientHeader` is read). For adapters. */
  statusSlot(key: string | null | undefined, principal: string | undefined, route: string, field: string, headers?: Headers | [string, string][] | Record<string, string | string[] | undefined>): number;
  /** The engine's reply as a Response (refusals through `options.problem`). */
  responseOf(reply: PlainReply): Response;
  /** A refusal of the engine's own mapped by `options.problem`, or undefined. */
  mappedRefusal(reply: PlainReply): Response | undefined;
  /** Issues and stores a one-time token (`keyKind: "token"`) for the caller of `request`,
   * to spend on `method` (default POST) to `route`. Rejects with the engine's refusal, its
   * `code` the requirement it cites. */
  issueToken(request: R, target: { route: string; method?: string }): Promise<{ token: string; expires: number }>;
  /** The token endpoint: the engine's reply, 201 `{ expiresAt, token, ttl }` with
   * `Cache-Control: no-store`, or its problem. */
  tokenResponse(request: R, target: { route: string; method?: string }): Promise<Response>;
  /** Opens (or moves to its next epoch) the counter session of `client` (`keyKind:
   * "counter"`); the numbers are decimal text. Rejects with the engine's refusal, its `code`
   * the requirement it cites (IDEM-CTR-1 for a bad client id or first number). */
  openSession(
    request: R,
    session: { route: string; client: string; firstSeq?: number | bigint | string; method?: string },
  ): Promise<{ client: string; epoch: string; firstSeq: string }>;
  /** The session endpoint: reads `{"client": "…", "firstSeq": n}` from the body of `request`
   * and answers with the engine's reply, 201 `{ client, epoch, firstSeq }` or its problem. */
  sessionResponse(request: R & Request, target: { route: string; method?: string }): Promise<Response>;
  /** The caller of `request` (and the handler's other arguments) as `options.principal`
   * states it, as a string (empty when it says nothing usable: refused, IDEM-SCOPE-3);
   * undefined for a single tenant (`"none"`). For adapters. */
  principalOf(request: R, ...rest: unknown[]): Promise<string | undefined>;
  /** Identifies a request and opens its slot, for `serve`: the raw key header value (or
   * null), the principal (`principalOf`), method, route, target (path and query), content
   * type, headers (only the fingerprint headers and `timeKeys.clientHeader` are read), body,
   * and a counter client's raw
   * low-water mark. A request that cannot be identified gets a slot too, whose first step is
   * its refusal. For adapters. */
  begin(
    key: string | null | undefined,
    principal: string | undefined,
    method: string,
    route: string,
    target: string,
    contentType: string | null | undefined,
    headers: PlainRequest["headers"] | null | undefined,
    body: Uint8Array,
    lowWater?: string | null,
  ): number;
  /** A slot answering 413 for a body of `length` bytes announced before it is read, or
   * undefined when it may be read (IDEM-LIMIT-1). For adapters. */
  refuseBody(length: number): number | undefined;
  /** Drives a slot (from `begin` or `refuseBody`) to its end: `execute(context)` when the
   * request runs, else `answer(reply)` with the engine's reply. For adapters. */
  serve<T>(slot: number, answer: (reply: PlainReply) => T | Promise<T>, execute?: (context: IdempotencyContext) => Promise<T>): Promise<T>;
  /** One delivery to this engine's inbox (see `Inbox#receive`). */
  deliver(
    message: { source: string; id: string; contentType?: string; body: Uint8Array },
    process: (context: InboxContext) => Promise<void> | void,
  ): Promise<InboxDelivery>;
}

/** What became of one delivery to an `Inbox`. */
export interface InboxDelivery {
  /** `processed` (it ran now), `duplicate` (already processed), `in-progress` (another
   * delivery is being processed), `conflict` (the id came with another payload), `held`
   * (an earlier delivery's outcome is unknown). */
  outcome: "processed" | "duplicate" | "in-progress" | "conflict" | "held" | "failed" | "refused";
  /** Whether to tell the source the message was received (2xx), so it stops sending it. */
  acknowledge: boolean;
  /** For `in-progress` and `held`: seconds until the source should deliver it again. */
  retryAfter?: number;
  /** The engine's receipt to answer the source with: 200 `{"outcome", "received": true}`
   * for what it may stop delivering, the core's problem (with `Retry-After`) otherwise. */
  response: Response;
}

/** What processing a message learns: the message, whether it takes over from a delivery
 * whose lease ended (reconcile first), the fence and end of its lease, and `extend()`, the
 * heartbeat that keeps the lease while the processing runs longer than it (a redelivery
 * after the lease ended would process the message again). */
export interface InboxContext {
  readonly source: string;
  readonly id: string;
  readonly recovered: boolean;
  readonly fence: number;
  readonly leaseExpires: number;
  /** Extends the lease by one lease period; rejects if another delivery took it over. */
  extend(): Promise<void>;
}

/** A receiver's inbox (webhooks, at-least-once queues): the first delivery of a message is
 * processed, redeliveries are acknowledged without processing. */
export class Inbox {
  constructor(options: Pick<IdempotencyOptions, "store" | "responseTtl" | "keyTtl" | "lease" | "unknownOutcome" | "fingerprint" | "onEvent" | "telemetry" | "now">);
  receive(
    delivery: { source: string; id: string; body?: string | ArrayBuffer | ArrayBufferView; contentType?: string },
    process: (context: InboxContext) => Promise<void> | void,
  ): Promise<InboxDelivery>;
}

/** idem-core's in-process store, inside the WebAssembly module (tests, single-process
 * servers). Full at `maxEntries` records (default 1,000,000) or `maxBytes` bytes of keys
 * and records (default 256 MiB): new claims then get 503 store-full. `load` and `apply`
 * take the engine's storage keys. */
export class MemoryStore implements IdempotencyStore {
  /** `seal`: every record is held sealed with the first key and opened with any
   * (IDEM-SEAL-1, IDEM-SEAL-2), so that no response is kept in clear in the process's
   * memory; `load` and `apply` then answer with promises. */
  constructor(options?: { maxEntries?: number; maxBytes?: number; seal?: SealOptions });
  readonly size: number;
  /** Bytes held, as counted against `maxBytes`. */
  readonly bytes: number;
  readonly expired: number;
  readonly nextDeadline: number | undefined;
  /** Replaces a sealed store's keys while it runs, keeping its records (IDEM-SEAL-2); false,
   * changing nothing, for a store made without `seal`. */
  replaceSeal(seal: SealOptions): boolean;
  /** The record under a storage key as this store holds it (sealed bytes in a sealed
   * store), for inspection; or undefined. */
  stored(key: string): Uint8Array | undefined;
  load(key: string): Promise<StoredRecord | null> | StoredRecord | null;
  apply(key: string, write: StoreWrite, now: number): Promise<boolean> | boolean;
  /** Applies expiry to every record due at `now`; returns how many changed. */
  sweep(now: number): number;
}

/** Minimal shapes of the Durable Object API this package uses. */
export interface DurableObjectStorageLike {
  get(key: string): Promise<unknown>;
  get(keys: string[]): Promise<Map<string, unknown>>;
  put(entries: Record<string, unknown>): Promise<void>;
  delete(key: string): Promise<boolean>;
  delete(keys: string[]): Promise<number>;
  list(options: { start?: string; end?: string; limit?: number }): Promise<Map<string, unknown>>;
  getAlarm(): Promise<number | null>;
  setAlarm(time: number): Promise<void>;
  deleteAlarm(): Promise<void>;
}
export interface DurableObjectStateLike {
  storage: DurableObjectStorageLike;
}
export interface DurableObjectNamespaceLike {
  idFromName(name: string): unknown;
  get(id: unknown): { fetch(input: string, init?: RequestInit): Promise<Response> };
}

/** A Durable Object class that owns a shard of keys and makes claims next to its storage. */
export class IdempotencyShard {
  /** `seal`: every record is sealed in the object's storage with the first key and opened
   * with any (IDEM-SEAL-1, IDEM-SEAL-2); a record none opens is answered 500 `record-sealed`
   * and never executed (IDEM-SEAL-3). Pass the keys from a subclass, out of the
   * environment's secrets. */
  constructor(state: DurableObjectStateLike, env?: unknown, options?: { prefix?: string; seal?: SealOptions });
  fetch(request: Request): Promise<Response>;
  claim(ticket: Uint8Array, options: string, now: number, nonceHi: number, nonceLo: number): Promise<Uint8Array>;
  apply(key: string, write: StoreWrite, now: number): Promise<boolean>;
  load(key: string): Promise<StoredRecord | null>;
  /** Expires what is due and sets the alarm for the next deadline; resolves true when the
   * host's own alarm (a shared alarm's, see DurableObjectLocalStore) was due. `work`, the
   * host's alarm work, runs first, and the alarm is spent once it has resolved. */
  alarm(work?: () => Promise<void> | void): Promise<boolean>;
}

/** The store a worker uses: each key belongs to one of a fixed set of IdempotencyShard
 * objects, chosen from the key alone, so that no setting or deploy moves a key. */
export class DurableObjectStore implements IdempotencyStore {
  /** `options.timeout`: how long one call of a shard may take in milliseconds (default
   * `storeTimeoutMs()`, 2000); a shard that does not answer by then is a 503. */
  constructor(namespace: DurableObjectNamespaceLike, options?: { timeout?: number });
  readonly maxResponseBytes: number;
  load(key: string): Promise<StoredRecord | null>;
  apply(key: string, write: StoreWrite, now: number): Promise<boolean>;
  claim(key: string, ticket: Uint8Array, options: string, now: number, nonceHi: number, nonceLo: number): Promise<Uint8Array>;
}

/** A handler's writes to its Durable Object's storage, written with the completion that
 * stores its response, in one atomic write, or never. */
export interface ObjectTransaction {
  /** The value stored under `key`, as this transaction has changed it. */
  get<T = unknown>(key: string): Promise<T | undefined>;
  /** Writes `value` under `key` with the completion. */
  put(key: string, value: unknown): void;
  /** Deletes `key` with the completion. */
  delete(key: string): void;
}

/** The handler's own storage keys one transaction writes at most. */
export const TRANSACTION_KEYS: number;

/** The store for a handler whose data lives in a Durable Object: records in the object's
 * own storage (under `prefix`, default `"idem:"`), claims and completions next to it, and
 * `transaction` to commit the handler's writes with its stored response. Call `alarm()` from
 * the object's `alarm()`; the object's one alarm is shared with the records, so an alarm of
 * the object's own is set with `setAlarm(time)` and its work passed to `alarm(work)`. */
export class DurableObjectLocalStore implements IdempotencyStore {
  constructor(
    state: DurableObjectStateLike,
    options?: {
      prefix?: string;
      /** Claims stay in the object's memory and a fresh request writes once, at its
       * completion (IDEM-STORE-8). Only for a handler whose every effect is a write of its
       * transaction: if the object dies, the next request for the key runs afresh at once. */
      writesOnly?: boolean;
      /** Records sealed in the object's storage, as `IdempotencyShard`'s (IDEM-SEAL-1). */
      seal?: SealOptions;
    },
  );
  readonly maxResponseBytes: number;
  load(key: string): Promise<StoredRecord | null>;
  apply(key: string, write: StoreWrite, now: number, info?: { outcome: "answered" | "threw"; fence: number }): Promise<boolean>;
  claim(key: string, ticket: Uint8Array, options: string, now: number, nonceHi: number, nonceLo: number): Promise<Uint8Array>;
  /** Expires what is due; resolves true when the object's own alarm (`setAlarm`) was due.
   * `work`, the object's own alarm work, runs when that alarm is due, and the alarm is spent
   * only once it has resolved: if it throws, so does this, and the platform's retry of the
   * alarm runs it again. */
  alarm(work?: () => Promise<void> | void): Promise<boolean>;
  /** The object's own alarm at `time` (ms since the epoch), or none with null; never
   * `storage.setAlarm`, which would move the records' expiry. */
  setAlarm(time: number | null): Promise<void>;
  /** The object's own alarm time, or null. */
  getAlarm(): Promise<number | null>;
  /** Runs `fn(tx)`; its writes commit with the completion that stores the response of the
   * request whose context is `context` (`idempotencyOf(request)`), or never. */
  transaction<T>(context: IdempotencyContext, fn: (tx: ObjectTransaction) => Promise<T>): Promise<T>;
}

/** An `about:blank` problem+json Response (RFC 9457) of `status` (400, 404, 405, 500 or 503),
 * titled with the status's reason phrase, with `detail`, rendered by the core: for what a
 * host refuses that idem has no type of its own for (a route that does not exist, a failure
 * of the host). Throws a RangeError (IDEM-JS-1) for another status. */
export function plainProblem(status: 400 | 404 | 405 | 500 | 503, detail: string): Response;

/** 405 Method Not Allowed, `about:blank`, naming the methods the resource takes (`allow`, for
 * example `"POST"` or `"GET, POST"`) in `Allow`. */
export function methodNotAllowed(allow: string): Response;

/** The header names and the media type idem's requests and answers use (idem-core's), lower
 * case: for CORS lists, routers and logs. `Idempotency-Key`. */
export function keyHeader(): string;
/** `Idempotency-Low-Water`: a counter client's oldest number whose answer has not arrived. */
export function lowWaterHeader(): string;
/** `Idempotency-Status`: the field that makes a `GET` a status query. */
export function statusHeader(): string;
/** `application/vnd.idem.key-status+json`: the media type of a status document. */
export function statusMediaType(): string;

/** The seal keys of a memory, Redis, Postgres or Durable Object store (IDEM-SEAL-1, IDEM-SEAL-2): the first seals
 * every record written, any of them opens a record sealed with it. An id is 1 to 64 visible
 * ASCII characters; a key is 32 bytes (AES-256) or an AES-GCM `CryptoKey`. */
export interface SealOptions {
  keys: { id: string; key: Uint8Array | ArrayBuffer | CryptoKey }[];
  /** Read records stored in clear too, while a store written before sealing was turned on
   * moves to sealing (until its key retention has passed). Off: a record in clear is
   * refused like one that does not open (IDEM-SEAL-3). */
  readClear?: boolean;
}

/** Seals and opens the records of a store (IDEM-SEAL-1), in idem-core's sealed format with
 * WebCrypto's AES-GCM: what the Redis, Postgres and Durable Object stores use, for a store of
 * your own. */
export interface RecordSealer {
  /** How many bytes sealing adds to a record. */
  readonly overhead: number;
  /** `record` sealed for `storageKey` with the first key. */
  seal(storageKey: string, record: Uint8Array): Promise<Uint8Array>;
  /** The record of `bytes` read under `storageKey`: opened, or as it is when it was stored
   * in clear. Rejects with code `IDEM-SEAL-3` when it cannot be opened. */
  open(storageKey: string, bytes: Uint8Array): Promise<Uint8Array>;
}

/** The sealer of a store's `seal` option, or null without one. Throws a RangeError
 * (IDEM-JS-1) for keys that cannot be used. */
export function recordSealer(option: SealOptions | undefined): RecordSealer | null;

/** What `sealer` (or null, for a store without keys) reads from `bytes` stored under
 * `storageKey`: the record, opened or in clear. Rejects with code `IDEM-SEAL-3` for a sealed
 * record it cannot open. */
export function openedRecord(sealer: RecordSealer | null, storageKey: string, bytes: Uint8Array): Promise<Uint8Array>;

/** Thrown by a store that cannot take another key (IDEM-STORE-3). */
export class StoreFullError extends Error {
  readonly code: "IDEM-STORE-3";
}

/** The name of the IdempotencyShard object that owns a storage key (what a store's `load`
 * and `apply` are called with). Fixed: a key never moves. */
export function shardName(storageKey: string): string;
