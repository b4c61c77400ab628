// The server side: `withIdempotency(handler, options)` for Fetch-standard handlers, and the
// `Idempotency` class underneath it for hosts that are not Fetch-shaped.
//
// Every decision is the engine's (idem-core, compiled to WebAssembly). This file only moves
// data: it reads the request, loads the record from the store, asks the engine, applies the
// engine's compare-and-set write, runs the handler and stores its outcome before the
// response is returned. Because stores are asynchronous, the claim loop runs here, the way
// `Store::claim` runs it in Rust: load, decide, conditional write, and on a lost race decide
// again (IDEM-JS-3).
import { Decision, DecisionKind, Engine, securityEvents, storeProblem } from "./idem_wasm.js";
import { flatHeaders, pairsOf, randomHalves, rangeError, sleep } from "./util.js";

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
const NULL_BODY_STATUS = new Set([101, 103, 204, 205, 304]);
// A claim that loses this many races in a row answers "in progress", as `Store::claim` does
// (idem-core's MAX_LOST_RACES).
const MAX_CLAIM_ROUNDS = 8;

let securityRelevant = null;

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

function engineOptions(o) {
  return JSON.stringify({
    responseTtl: o.responseTtl,
    keyTtl: o.keyTtl,
    lease: o.lease,
    unknownOutcome: o.unknownOutcome,
    keyKind: o.keyKind,
    fingerprint: o.fingerprint,
  });
}

/** Reads a Reply (wasm) into plain data and frees it. */
function takeReply(reply) {
  try {
    return { status: reply.status, headers: reply.headers, body: reply.body };
  } finally {
    reply.free();
  }
}

/** Reads a Write (wasm) into the shape stores take. */
function storeWrite(write) {
  return { expect: write.expect ?? null, value: write.value ?? null, version: write.version, deadline: write.deadline };
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
  #required;
  #methods;
  #inFlight;
  #scope;
  #route;
  #onEvent;
  #now;
  #fingerprintHeaders;
  #waiters = new Map();

  constructor(options) {
    checkOptions(options);
    this.#optionsText = engineOptions(options);
    this.#engine = new Engine(this.#optionsText);
    this.#store = options.store;
    this.#required = options.keys !== "optional";
    this.#methods = new Set((options.methods ?? ["POST", "PATCH"]).map((m) => m.toUpperCase()));
    this.#inFlight = options.inFlight && options.inFlight !== "reject" ? options.inFlight : null;
    this.#scope = options.scope ?? null;
    this.#route = options.route ?? null;
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
    if (this.#onEvent === null) return;
    securityRelevant ??= new Set(securityEvents());
    try {
      this.#onEvent({ name, key, securityRelevant: securityRelevant.has(name), ...extra });
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
    const prepared = this.prepare(input);
    if (prepared.reply) return { ...prepared.reply, replayed: false };
    const attempt = prepared.attempt;
    try {
      const claim = await this.claim(attempt);
      if (claim.reply) return claim.reply;
      const context = claim.context;
      let out;
      try {
        out = await run(context);
      } catch (err) {
        await this.fail(attempt, context);
        throw err;
      }
      const headers = flatHeaders(out.headers);
      const body = typeof out.body === "string" ? new TextEncoder().encode(out.body) : (out.body ?? new Uint8Array(0));
      await this.complete(attempt, context, out.status, headers, body);
      return { status: out.status, headers, body, replayed: false };
    } finally {
      attempt.free();
    }
  }

  /** Identifies a request: `{ attempt }`, or `{ reply }` with the problem for a bad key or
   * body (IDEM-KEY-1, IDEM-KEY-3, IDEM-FP-6, IDEM-LIMIT-1). */
  prepare(input) {
    const headerList = [];
    if (this.#fingerprintHeaders.length > 0 && input.headers != null) {
      const flat = flatHeaders(input.headers);
      for (let i = 0; i < flat.length; i += 2) {
        if (this.#fingerprintHeaders.includes(flat[i])) headerList.push(flat[i], flat[i + 1]);
      }
    }
    try {
      const attempt = this.#engine.attempt(
        input.key ?? undefined,
        input.principal ?? "",
        input.method,
        input.route ?? input.target.split("?", 1)[0],
        input.target,
        input.contentType ?? undefined,
        headerList,
        input.body ?? new Uint8Array(0),
      );
      return { attempt };
    } catch (err) {
      if (err?.problem === undefined) throw err;
      this.#emit("rejected", null, { code: err.code });
      const headers = ["content-type", "application/problem+json"];
      return { reply: { status: err.status, headers, body: new TextEncoder().encode(err.problem) } };
    }
  }

  /** Refuses a body longer than the fingerprint limit before it is read (IDEM-LIMIT-1). */
  checkBodySize(length) {
    try {
      this.#engine.checkBodySize(length);
      return null;
    } catch (err) {
      if (err?.problem === undefined) throw err;
      this.#emit("rejected", null, { code: err.code });
      return {
        status: err.status,
        headers: ["content-type", "application/problem+json"],
        body: new TextEncoder().encode(err.problem),
        replayed: false,
      };
    }
  }

  /** Claims the key: `{ context }` when this request executes, or `{ reply }` (replay,
   * 409 in progress, 422 mismatch, 410, 503) otherwise. */
  async claim(attempt) {
    let decision = await this.#decide(attempt);
    if (!(decision instanceof Decision)) return decision;
    if (decision.kind === DecisionKind.InProgress && this.#inFlight !== null) {
      decision.free();
      decision = await this.#wait(attempt);
      if (!(decision instanceof Decision)) return decision;
    }
    return this.#answer(attempt, decision);
  }

  #answer(attempt, decision) {
    try {
      const key = attempt.key;
      this.#emit(decision.event, key, decision.recovered ? { recovered: true } : undefined);
      if (decision.kind !== DecisionKind.Execute) {
        const reply = takeReply(decision.reply());
        reply.replayed = decision.kind === DecisionKind.Replay;
        return { reply };
      }
      const lease = decision.takeLease();
      const context = {
        key,
        recovered: decision.recovered,
        fence: lease.fence,
        leaseExpires: lease.expires,
        lease,
        extend: () => this.#extend(attempt, context),
      };
      return { context };
    } finally {
      decision.free();
    }
  }

  /** One claim: through the store's own engine-side claim (a Durable Object), or the CAS
   * loop. Resolves to a Decision, or to `{ reply }` when the store failed (IDEM-STORE-3,
   * IDEM-STORE-4). */
  async #decide(attempt) {
    const store = this.#store;
    const storageKey = attempt.storageKey;
    try {
      if (typeof store.claim === "function") {
        const [hi, lo] = randomHalves();
        const bytes = await store.claim(storageKey, attempt.encode(), this.#optionsText, this.#now(), hi, lo);
        return Decision.decodeClaim(bytes);
      }
      for (let round = 0; round < MAX_CLAIM_ROUNDS; round++) {
        const current = await store.load(storageKey);
        const [hi, lo] = randomHalves();
        const decision = this.#engine.decide(this.#now(), attempt, hi, lo, current?.value ?? undefined);
        if (decision.kind !== DecisionKind.Execute) return decision;
        const write = decision.takeWrite();
        const applied = await store.apply(storageKey, storeWrite(write), this.#now());
        write.free();
        if (applied) return decision;
        decision.free();
      }
      return Decision.contended();
    } catch (err) {
      if (err?.code === "IDEM-REC-1") throw err;
      const full = err?.code === "IDEM-STORE-3";
      this.#emit("rejected", attempt.key, { code: full ? "IDEM-STORE-3" : "IDEM-STORE-4", error: err });
      const reply = takeReply(storeProblem(full, full ? "the idempotency store is full" : "the idempotency store is unavailable"));
      reply.replayed = false;
      return { reply };
    }
  }

  /** The in-flight wait policy: poll until the first attempt's result is stored (then
   * replay it), its lease ends (then take over), or the bound passes (then 409). Only the
   * latest waiter for a key keeps waiting: an earlier one is answered at once with the
   * engine's current decision, since its client has retried and stopped listening. */
  async #wait(attempt) {
    const storageKey = attempt.storageKey;
    const superseded = new AbortController();
    this.#waiters.get(storageKey)?.abort();
    this.#waiters.set(storageKey, superseded);
    const until = this.#now() + this.#inFlight.wait;
    const poll = this.#inFlight.poll ?? 25;
    try {
      for (;;) {
        const left = until - this.#now();
        if (left > 0 && !superseded.signal.aborted) await sleep(Math.min(poll, left), superseded.signal);
        const decision = await this.#decide(attempt);
        if (!(decision instanceof Decision) || decision.kind !== DecisionKind.InProgress) return decision;
        if (superseded.signal.aborted || this.#now() >= until) return decision;
        decision.free();
      }
    } finally {
      if (this.#waiters.get(storageKey) === superseded) this.#waiters.delete(storageKey);
    }
  }

  async #apply(attempt, write, context) {
    const lease = write.takeLease();
    const event = write.event;
    let applied;
    try {
      applied = await this.#store.apply(attempt.storageKey, storeWrite(write), this.#now());
    } catch (err) {
      // IDEM-OUT-5: the response is still sent; the lease is left to expire.
      this.#emit("rejected", context.key, { code: "IDEM-STORE-4", error: err });
      lease?.free();
      return false;
    } finally {
      write.free();
    }
    this.#emit(applied ? event : "fenced-out", context.key, { fence: context.fence });
    if (lease) {
      if (applied) {
        context.lease.free();
        context.lease = lease;
        context.leaseExpires = lease.expires;
      } else {
        lease.free();
      }
    }
    return applied;
  }

  /** Stores the handler's response under the request's lease (IDEM-OUT-5: before the
   * response leaves). Resolves to false when the lease was fenced out (IDEM-LEASE-2) or the
   * store failed; the response is sent either way. */
  async complete(attempt, context, status, flatHeaderList, body) {
    try {
      return await this.#apply(attempt, this.#engine.complete(this.#now(), context.lease, status, flatHeaderList, body), context);
    } finally {
      context.lease.free();
    }
  }

  /** Records that the handler threw: an unknown outcome under the configured policy. */
  async fail(attempt, context) {
    try {
      return await this.#apply(attempt, this.#engine.fail(this.#now(), context.lease), context);
    } finally {
      context.lease.free();
    }
  }

  async #extend(attempt, context) {
    const write = this.#engine.extend(this.#now(), context.lease);
    const ok = await this.#apply(attempt, write, context);
    if (!ok) throw rangeError("IDEM-LEASE-2", "the lease was taken over by another attempt");
  }
}

function toResponse(reply) {
  const headers = pairsOf(reply.headers);
  return new Response(NULL_BODY_STATUS.has(reply.status) ? null : reply.body, { status: reply.status, headers });
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
    if (length !== null) {
      const tooLarge = idem.checkBodySize(Number(length));
      if (tooLarge) return toResponse(tooLarge);
    }
    const body = request.body === null ? new Uint8Array(0) : new Uint8Array(await request.arrayBuffer());
    const url = new URL(request.url);
    const principal = scope ? await scope(request) : (headers.get("authorization") ?? "");
    const prepared = idem.prepare({
      method,
      target: url.pathname + url.search,
      route: route ? await route(request, url) : url.pathname,
      principal: String(principal ?? ""),
      key,
      contentType: headers.get("content-type"),
      headers,
      body,
    });
    if (prepared.reply) return toResponse(prepared.reply);
    const attempt = prepared.attempt;
    try {
      const claim = await idem.claim(attempt);
      if (claim.reply) return toResponse(claim.reply);
      const context = claim.context;
      const forHandler = request.body === null ? request : new Request(request, { body });
      contexts.set(forHandler, context);
      let response;
      try {
        response = await handler(forHandler, ...rest);
      } catch (err) {
        await idem.fail(attempt, context);
        throw err;
      }
      const bytes = new Uint8Array(await response.arrayBuffer());
      await idem.complete(attempt, context, response.status, flatHeaders(response.headers), bytes);
      return new Response(NULL_BODY_STATUS.has(response.status) ? null : bytes, {
        status: response.status,
        statusText: response.statusText,
        headers: response.headers,
      });
    } finally {
      attempt.free();
    }
  };
}
