// The server side: `withIdempotency(handler, options)` for Fetch-standard handlers, and the
// `Idempotency` class underneath it for hosts that are not Fetch-shaped.
//
// Every decision is the engine's (idem-core, compiled to WebAssembly). This file only moves
// data: it reads the request, claims the key, runs the handler and stores its outcome before
// the response is returned. With the MemoryStore the records live inside the module and a
// request is three calls: identify (`begin`), claim (`claimIn`, idem-core's Store::claim)
// and complete (`finishIn`, Store::finish). Other stores are asynchronous, so the claim loop
// runs here, the way Store::claim runs it in Rust: load, decide, conditional write, and on a
// lost race decide again (IDEM-JS-3).
import { Engine, eventNames, securityMask, storeProblem } from "./idem_wasm.js";
import { recordsOf } from "./stores.js";
import {
  flatHeaders,
  listText,
  pairsOf,
  random32,
  rangeError,
  readReply,
  readWrite,
  takeReply,
  sleep,
  writeEvent,
} from "./util.js";

const OPTION_NAMES = new Set([
  "store",
  "keys",
  "keyKind",
  "responseTtl",
  "keyTtl",
  "lease",
  "unknownOutcome",
  "inFlight",
  "fingerprint",
  "scope",
  "route",
  "methods",
  "onEvent",
  "now",
]);
const FINGERPRINT_NAMES = new Set(["headers", "exclude", "json", "maxBody"]);
const UNKNOWN_OUTCOMES = ["reexecute", "store", "hold"];
const KEY_KINDS = ["opaque", "opaque-strict", "uuid", "uuid-v4", "uuid-v7"];
const JSON_MODES = ["auto", "always", "never"];
const NULL_BODY_STATUS = new Set([101, 103, 204, 205, 304]);
const EMPTY = new Uint8Array(0);
// A claim that loses this many races in a row answers "in progress", as `Store::claim` does
// (idem-core's MAX_LOST_RACES).
const MAX_CLAIM_ROUNDS = 8;

// Claim codes (src/interop.rs): the low three bits are the kind, bit 3 is `recovered`, the
// rest is the event's index.
const EXECUTE = 0;
const REPLAY = 1;
const IN_PROGRESS = 2;
const FULL = 5;
// What the handler's run came to (src/host.rs, `Ran`).
const ANSWERED = 0;
const THREW = 1;

let events = null;
function eventName(index) {
  events ??= { names: eventNames().split(","), security: securityMask() };
  return events.names[index];
}
function securityRelevant(name) {
  eventName(0);
  const i = events.names.indexOf(name);
  return i >= 0 && (events.security & (1 << i)) !== 0;
}

/** Per-request idempotency context, for handlers: see `idempotencyOf`. */
const contexts = new WeakMap();

/**
 * The idempotency context of a request that `withIdempotency` is executing: the key, whether
 * this execution takes over from an attempt whose lease expired (`recovered`: reconcile
 * before acting), the fencing number, and `extend()`, a heartbeat for long handlers.
 * `undefined` for requests that pass through (no key, or a method that is not guarded).
 */
export function idempotencyOf(request) {
  return contexts.get(request);
}

function checkOptions(options) {
  if (options === null || typeof options !== "object") {
    throw rangeError("IDEM-JS-1", "options must be an object with at least a store");
  }
  for (const name of Object.keys(options)) {
    if (!OPTION_NAMES.has(name)) throw rangeError("IDEM-JS-1", `unknown option "${name}"`);
  }
  const store = options.store;
  const usable =
    store != null &&
    (typeof store.claim === "function" || typeof store.load === "function") &&
    typeof store.apply === "function";
  if (!usable) {
    throw rangeError("IDEM-JS-1", "options.store must implement load(key) and apply(key, write, now)");
  }
  if (options.keys !== undefined && options.keys !== "required" && options.keys !== "optional") {
    throw rangeError("IDEM-JS-1", 'options.keys must be "required" or "optional"');
  }
  const inFlight = options.inFlight;
  if (inFlight !== undefined && inFlight !== "reject") {
    const ok =
      typeof inFlight === "object" &&
      Number.isFinite(inFlight.wait) &&
      inFlight.wait > 0 &&
      (inFlight.poll === undefined || (Number.isFinite(inFlight.poll) && inFlight.poll > 0));
    if (!ok) {
      throw rangeError("IDEM-JS-1", 'options.inFlight must be "reject" or { wait: ms, poll?: ms }');
    }
  }
  for (const fn of ["scope", "route", "onEvent", "now"]) {
    if (options[fn] !== undefined && typeof options[fn] !== "function") {
      throw rangeError("IDEM-JS-1", `options.${fn} must be a function`);
    }
  }
  if (
    options.methods !== undefined &&
    !(Array.isArray(options.methods) && options.methods.every((m) => typeof m === "string"))
  ) {
    throw rangeError("IDEM-JS-1", "options.methods must be an array of method names");
  }
}

/** The engine options as text: what a Durable Object needs to build the same engine. */
function engineOptionsText(o) {
  return JSON.stringify({
    responseTtl: o.responseTtl,
    keyTtl: o.keyTtl,
    lease: o.lease,
    unknownOutcome: o.unknownOutcome,
    keyKind: o.keyKind,
    fingerprint: o.fingerprint,
  });
}

function num(name, value) {
  if (value == null) return NaN;
  if (typeof value !== "number") throw rangeError("IDEM-JS-1", `${name} must be a number`);
  return value;
}

function pick(name, value, choices) {
  if (value == null) return NaN;
  const i = choices.indexOf(value);
  if (i < 0) throw rangeError("IDEM-JS-1", `${name} must be ${choices.map((c) => `"${c}"`).join(", ")}`);
  return i;
}

function names(name, value) {
  if (value == null) return "";
  if (!(Array.isArray(value) && value.every((v) => typeof v === "string"))) {
    throw rangeError("IDEM-JS-1", `${name} must be an array of strings`);
  }
  return listText(value);
}

/**
 * The engine for these options (`responseTtl`, `keyTtl`, `lease`, `unknownOutcome`,
 * `keyKind`, `fingerprint`; other properties are ignored). Throws a RangeError (IDEM-JS-1,
 * or IDEM-TTL-2 when `keyTtl < responseTtl`).
 */
export function createEngine(o) {
  const f = o.fingerprint ?? {};
  if (typeof f !== "object") throw rangeError("IDEM-JS-1", "options.fingerprint must be an object");
  for (const name of Object.keys(f)) {
    if (!FINGERPRINT_NAMES.has(name)) throw rangeError("IDEM-JS-1", `unknown option "fingerprint.${name}"`);
  }
  const numbers = [
    num("responseTtl", o.responseTtl),
    num("keyTtl", o.keyTtl),
    num("lease", o.lease),
    pick("unknownOutcome", o.unknownOutcome, UNKNOWN_OUTCOMES),
    pick("keyKind", o.keyKind, KEY_KINDS),
    pick("fingerprint.json", f.json, JSON_MODES),
    num("fingerprint.maxBody", f.maxBody),
  ];
  return new Engine(numbers, names("fingerprint.headers", f.headers), names("fingerprint.exclude", f.exclude));
}

function problemReply(bytes) {
  const reply = readReply(bytes);
  reply.replayed = false;
  return reply;
}

/**
 * The engine bound to a store and the host's settings. `withIdempotency` wraps a Fetch
 * handler with one; hosts that are not Fetch-shaped (an Express adapter, a queue consumer)
 * call `handle` with plain objects.
 */
export class Idempotency {
  #engine;
  #optionsText;
  #store;
  #records;
  #required;
  #methods;
  #inFlight;
  #onEvent;
  #now;
  #fingerprintHeaders;
  #waiters = new Map();

  constructor(options) {
    checkOptions(options);
    this.#optionsText = engineOptionsText(options);
    this.#engine = createEngine(options);
    this.#store = options.store;
    this.#records = recordsOf(options.store);
    this.#required = options.keys !== "optional";
    this.#methods = new Set((options.methods ?? ["POST", "PATCH"]).map((m) => m.toUpperCase()));
    this.#inFlight = options.inFlight && options.inFlight !== "reject" ? options.inFlight : null;
    this.#onEvent = options.onEvent ?? null;
    this.#now = options.now ?? Date.now;
    this.#fingerprintHeaders = (options.fingerprint?.headers ?? []).map((h) => String(h).toLowerCase());
  }

  /** Whether requests with this method are guarded. */
  guards(method) {
    return this.#methods.has(method);
  }

  /** Whether requests without a key are refused (otherwise they pass through). */
  get keysRequired() {
    return this.#required;
  }

  #emit(name, key, extra) {
    try {
      this.#onEvent({ name, key, securityRelevant: securityRelevant(name), ...extra });
    } catch {
      // A failing hook never changes how a request is answered.
    }
  }

  /**
   * Handles one request given as plain data:
   * `{ method, target, route?, principal?, key, contentType?, headers?, body? }`, where
   * `target` is the path and query, `key` the raw `Idempotency-Key` header value (or null),
   * `headers` a Headers object, pair list or record (only the fingerprint headers are read)
   * and `body` a Uint8Array. `run(context)` executes the handler and returns
   * `{ status, headers?, body? }`. Resolves to `{ status, headers, body, replayed }` with
   * headers as a flat `[name, value, …]` list.
   */
  async handle(input, run) {
    const target = input.target;
    const slot = this.begin(
      input.key,
      input.principal ?? "",
      input.method,
      input.route ?? routeOf(target),
      target,
      input.contentType,
      input.headers,
      input.body ?? EMPTY,
    );
    if (slot < 0) return this.problem();
    return this.serve(slot, plainReply, async (context) => {
      let out;
      try {
        out = await run(context);
      } catch (err) {
        await this.finish(slot, context, THREW, 0, null, EMPTY);
        throw err;
      }
      const headers = flatHeaders(out.headers);
      const body = typeof out.body === "string" ? textEncoder.encode(out.body) : (out.body ?? EMPTY);
      // The memory store answers at once; other stores answer with a promise.
      const stored = this.finish(slot, context, ANSWERED, out.status, headers, body);
      if (typeof stored !== "boolean") await stored;
      return { status: out.status, headers, body, replayed: false };
    });
  }

  /** Identifies a request: its slot (an integer), or -1 for a missing or malformed key or an
   * unusable body, answered by `problem()` (IDEM-KEY-1, IDEM-KEY-3, IDEM-FP-6,
   * IDEM-LIMIT-1). `headers` is only read for the fingerprint headers. */
  begin(key, principal, method, route, target, contentType, headers, body) {
    let selected = "";
    const names = this.#fingerprintHeaders;
    if (names.length > 0 && headers != null) {
      const list = [];
      if (typeof headers.get === "function" && typeof headers.getSetCookie === "function") {
        // A Headers object: look the few names up instead of walking every header.
        for (const name of names) {
          if (name === "set-cookie") {
            for (const v of headers.getSetCookie()) list.push(name, v);
          } else {
            const v = headers.get(name);
            if (v !== null) list.push(name, v);
          }
        }
      } else {
        const flat = flatHeaders(headers);
        for (let i = 0; i < flat.length; i += 2) {
          if (names.includes(flat[i])) list.push(flat[i], flat[i + 1]);
        }
      }
      selected = listText(list);
    }
    return this.#engine.begin(key ?? undefined, principal, method, route, target, contentType ?? undefined, selected, body);
  }

  /** The reply to the last refused request (`begin` gave -1, `checkBodySize` false). */
  problem() {
    if (this.#onEvent !== null) this.#emit("rejected", null, { code: this.#engine.problemCode() });
    const reply = takeReply(this.#engine, -1);
    reply.replayed = false;
    return reply;
  }

  /** Whether a body of this many bytes may be read: false past the fingerprint limit
   * (IDEM-LIMIT-1), answered by `problem()`. */
  checkBodySize(length) {
    return this.#engine.checkBodySize(length);
  }

  /** Claims the slot's key and answers: `execute(context)` when this request runs, or
   * `answer(reply)` with the engine's reply (replay, 409, 422, 410, 503). Ends the slot. */
  async serve(slot, answer, execute) {
    const engine = this.#engine;
    try {
      let code = this.#records !== null ? engine.claimIn(this.#records, slot, this.#now(), random32(), random32()) : await this.#claim(slot);
      if (typeof code !== "number") return answer(code);
      if ((code & 7) === IN_PROGRESS && this.#inFlight !== null) {
        code = await this.#wait(slot);
        if (typeof code !== "number") return answer(code);
      }
      const kind = code & 7;
      if (kind === FULL) return answer(this.#storeFailed(slot, null, true));
      const recovered = (code & 8) !== 0;
      if (this.#onEvent !== null) this.#emit(eventName(code >> 4), engine.key(slot), recovered ? { recovered } : undefined);
      if (kind !== EXECUTE) {
        const reply = takeReply(engine, slot);
        reply.replayed = kind === REPLAY;
        return answer(reply);
      }
      const context = {
        key: engine.key(slot),
        recovered,
        fence: engine.fence(slot),
        leaseExpires: engine.expires(slot),
        extend: () => this.#extend(slot, context),
      };
      return await execute(context);
    } finally {
      engine.end(slot);
    }
  }

  #storeFailed(slot, error, full) {
    if (this.#onEvent !== null) {
      this.#emit("rejected", this.#engine.key(slot), { code: full ? "IDEM-STORE-3" : "IDEM-STORE-4", error: error ?? undefined });
    }
    return problemReply(storeProblem(full, full ? "the idempotency store is full" : "the idempotency store is unavailable"));
  }

  /** One claim in an asynchronous store: through the store's own engine-side claim (a
   * Durable Object), or the compare-and-set loop. Resolves to a claim code, or to a reply
   * when the store failed (IDEM-STORE-3, IDEM-STORE-4). */
  async #claim(slot) {
    const engine = this.#engine;
    const store = this.#store;
    const storageKey = engine.storageKey(slot);
    try {
      if (typeof store.claim === "function") {
        const bytes = await store.claim(storageKey, engine.encodeAttempt(slot), this.#optionsText, this.#now(), random32(), random32());
        return engine.claimEncoded(slot, bytes);
      }
      for (let round = 0; round < MAX_CLAIM_ROUNDS; round++) {
        const current = await store.load(storageKey);
        const code = engine.decide(slot, this.#now(), random32(), random32(), current?.value ?? undefined);
        if ((code & 7) !== EXECUTE) return code;
        if (await store.apply(storageKey, readWrite(engine.takeWrite()), this.#now())) {
          engine.commit(slot);
          return code;
        }
      }
      return engine.contended(slot);
    } catch (err) {
      if (err?.code === "IDEM-REC-1") throw err;
      return this.#storeFailed(slot, err, err?.code === "IDEM-STORE-3");
    }
  }

  /** The in-flight wait policy: poll until the first attempt's result is stored (then
   * replay it), its lease ends (then take over), or the bound passes (then 409). Only the
   * latest waiter for a key keeps waiting: an earlier one is answered at once with the
   * engine's current decision, since its client has retried and stopped listening. */
  async #wait(slot) {
    const storageKey = this.#engine.storageKey(slot);
    // A plain token per waiter: the latest one in the map keeps waiting, earlier ones notice
    // at their next poll. (Not an AbortController: workerd refuses to let one request abort
    // an object another request created.)
    const me = {};
    this.#waiters.set(storageKey, me);
    const superseded = () => this.#waiters.get(storageKey) !== me;
    const until = this.#now() + this.#inFlight.wait;
    const poll = this.#inFlight.poll ?? 25;
    try {
      for (;;) {
        const left = until - this.#now();
        if (left > 0 && !superseded()) await sleep(Math.min(poll, left));
        const code =
          this.#records !== null
            ? this.#engine.claimIn(this.#records, slot, this.#now(), random32(), random32())
            : await this.#claim(slot);
        if (typeof code !== "number" || (code & 7) !== IN_PROGRESS) return code;
        if (superseded() || this.#now() >= until) return code;
      }
    } finally {
      if (!superseded()) this.#waiters.delete(storageKey);
    }
  }

  /** Applies a write to an asynchronous store and reports its event. */
  async #apply(slot, bytes, context) {
    let applied;
    try {
      applied = await this.#store.apply(this.#engine.storageKey(slot), readWrite(bytes), this.#now());
    } catch (err) {
      // IDEM-OUT-5: the response is still sent; the lease is left to expire.
      if (this.#onEvent !== null) this.#emit("rejected", context.key, { code: "IDEM-STORE-4", error: err });
      return false;
    }
    if (this.#onEvent !== null) this.#emit(applied ? eventName(writeEvent(bytes)) : "fenced-out", context.key, { fence: context.fence });
    return applied;
  }

  /** Stores the handler's outcome under the slot's lease (IDEM-OUT-5: before the response
   * leaves): `ran` is 0 (answered with status, a flat header list and the body bytes) or 1
   * (threw). Resolves to false when the lease was fenced out (IDEM-LEASE-2) or the store
   * failed; the response is sent either way. */
  finish(slot, context, ran, status, headers, body) {
    const engine = this.#engine;
    const text = headers === null ? "" : listText(headers);
    if (this.#records !== null) {
      const event = eventName(engine.finishIn(this.#records, slot, this.#now(), ran, status, text, body));
      if (this.#onEvent !== null) this.#emit(event, context.key, { fence: context.fence });
      return event !== "fenced-out";
    }
    return this.#apply(slot, engine.complete(slot, this.#now(), ran, status, text, body), context);
  }

  async #extend(slot, context) {
    const engine = this.#engine;
    let ok;
    if (this.#records !== null) {
      ok = engine.extendIn(this.#records, slot, this.#now());
      if (this.#onEvent !== null) this.#emit(ok ? "extended" : "fenced-out", context.key, { fence: context.fence });
    } else {
      ok = await this.#apply(slot, engine.extend(slot, this.#now()), context);
      if (ok) engine.commit(slot);
    }
    if (!ok) throw rangeError("IDEM-LEASE-2", "the lease was taken over by another attempt");
    context.leaseExpires = engine.expires(slot);
  }
}

const textEncoder = new TextEncoder();

function plainReply(reply) {
  return reply;
}

/** The route of a target: its path. */
function routeOf(target) {
  const q = target.indexOf("?");
  return q < 0 ? target : target.slice(0, q);
}

/** Path and query of a request URL, as `url.pathname + url.search` gives them (a URL that
 * is not plain http(s) goes through the URL parser). */
function targetOf(href) {
  const scheme = href.startsWith("https://") ? 8 : href.startsWith("http://") ? 7 : 0;
  const path = scheme === 0 ? -1 : href.indexOf("/", scheme);
  if (path < 0) {
    const url = new URL(href);
    return url.pathname + url.search;
  }
  let end = href.indexOf("#", path);
  if (end < 0) end = href.length;
  // An empty query ("?" alone) is no query, as `url.search` says.
  if (href.charCodeAt(end - 1) === 63 && href.indexOf("?", path) === end - 1) end--;
  return href.slice(path, end);
}

function toResponse(reply) {
  return new Response(NULL_BODY_STATUS.has(reply.status) ? null : reply.body, {
    status: reply.status,
    headers: pairsOf(reply.headers),
  });
}

/**
 * Wraps a Fetch handler `(request, ...rest) => Response` with Idempotency-Key semantics.
 * Guarded requests (POST and PATCH by default) with a key are claimed before the handler
 * runs; a retry gets the stored response with `Idempotent-Replayed: true`; a duplicate in
 * flight gets 409 with `Retry-After` (or waits, with `inFlight: { wait }`); a changed payload
 * gets 422; a bad key or body gets 400/413. All refusals are `application/problem+json`.
 * The response is stored before it is returned.
 */
export function withIdempotency(handler, options) {
  if (typeof handler !== "function") throw rangeError("IDEM-JS-1", "handler must be a function");
  const idem = new Idempotency(options);
  const scope = options.scope ?? null;
  const route = options.route ?? null;
  return async function idempotent(request, ...rest) {
    const method = request.method;
    if (!idem.guards(method)) return handler(request, ...rest);
    const headers = request.headers;
    const key = headers.get("idempotency-key");
    if (key === null && !idem.keysRequired) return handler(request, ...rest);
    const length = headers.get("content-length");
    if (length !== null && !idem.checkBodySize(Number(length))) return toResponse(idem.problem());
    let body = EMPTY;
    if (request.body !== null) {
      // A declared length was checked above; a body without one (chunked) is read only up
      // to the limit, so an endless upload cannot fill the isolate's memory.
      body = length !== null ? new Uint8Array(await request.arrayBuffer()) : await readCapped(request.body, idem);
      if (body === null) return toResponse(idem.problem());
    }
    const href = request.url;
    const target = targetOf(href);
    const principal = scope ? await scope(request) : headers.get("authorization");
    const slot = idem.begin(
      key,
      String(principal ?? ""),
      method,
      route ? await route(request, new URL(href)) : routeOf(target),
      target,
      headers.get("content-type"),
      headers,
      body,
    );
    if (slot < 0) return toResponse(idem.problem());
    return idem.serve(slot, toResponse, async (context) => {
      // The handler gets a request it can read: the body was read for the fingerprint.
      const forHandler = request.body !== null ? new Request(request, { body }) : request;
      contexts.set(forHandler, context);
      let response;
      try {
        response = await handler(forHandler, ...rest);
      } catch (err) {
        await idem.finish(slot, context, THREW, 0, null, EMPTY);
        throw err;
      }
      const status = response.status;
      const nullBody = NULL_BODY_STATUS.has(status) || response.body === null;
      const bytes = nullBody ? EMPTY : new Uint8Array(await response.arrayBuffer());
      const stored = idem.finish(slot, context, ANSWERED, status, flatHeaders(response.headers), bytes);
      if (typeof stored !== "boolean") await stored;
      // The body was read to store it: the caller gets the same response with the bytes.
      return nullBody
        ? response
        : new Response(bytes, { status, statusText: response.statusText, headers: response.headers });
    });
  };
}

/** Reads a stream while `idem.checkBodySize` allows; `null` (the stream cancelled) past it. */
async function readCapped(stream, idem) {
  const reader = stream.getReader();
  const chunks = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.byteLength;
    if (!idem.checkBodySize(total)) {
      await reader.cancel();
      return null;
    }
    chunks.push(value);
  }
  if (chunks.length === 1) return chunks[0];
  const out = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.byteLength;
  }
  return out;
}
