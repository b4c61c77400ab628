// The server side: `withIdempotency(handler, options)` for Fetch-standard handlers, and the
// `Idempotency` class underneath it for hosts that are not Fetch-shaped.
//
// Every rule is idem-core's request machine (compiled to WebAssembly): this file only moves
// data. It identifies the request, then asks the machine for the next step and does it
// (read or write the store, sleep, run the handler, send the reply), reporting each result
// back. With the MemoryStore every store step runs inside the module.
import {
  Engine,
  HeartbeatState,
  Ran,
  StepKind as Step,
  acknowledgedMask,
  deliveryNames,
  engineOptionNames,
  eventNames,
  lowWaterHeader,
  securityMask,
} from "./idem_wasm.js";
import { recordsOf } from "./stores.js";
import { random32, sleep } from "./common.js";
import { bytesNow, flatHeaders, listText, rangeError, takeContext, takeReply, takeWrite } from "./util.js";

/** The options this file reads itself; the engine options are read by the module. */
const HOST_OPTIONS = ["store", "principal", "route", "onEvent", "now", "keyHeader", "problem"];
const NULL_BODY_STATUS = new Set([101, 103, 204, 205, 304]);
/** An HTTP field name (RFC 9110 token). */
const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
const EMPTY = new Uint8Array(0);

let events = null;
function eventName(index) {
  events ??= { names: eventNames().split(","), security: securityMask() };
  return events.names[index];
}
function securityRelevant(index) {
  eventName(0);
  return (events.security & (1 << index)) !== 0;
}

let optionNames = null;
let lowWater = null;

/** The request header that carries a counter client's low-water mark (idem-core's name). */
function lowWaterName() {
  lowWater ??= lowWaterHeader();
  return lowWater;
}

/** Per-request idempotency context, for handlers: see `idempotencyOf`. */
const contexts = new WeakMap();

/** Responses built by a context's `respond` or `json` → the bytes they were built from, so
 * that `withIdempotency` stores them without reading the body back (IDEM-JS-5). */
const builtBodies = new WeakMap();

/**
 * The idempotency context of a request that `withIdempotency` is executing: the key, whether
 * this execution takes over from an attempt whose lease expired (`recovered`: reconcile
 * before acting), the fencing number, when the lease ends, and `extend()`, a heartbeat for
 * long handlers. `undefined` for requests that pass through (no key, or a method that is
 * not guarded).
 */
export function idempotencyOf(request) {
  return contexts.get(request);
}

const PRINCIPAL_HELP =
  'options.principal is required: a function (request) => the caller\'s stable id (an account or user id, ' +
  'never a bearer token that rotates), or "none" for an API with a single tenant';

function checkOptions(options) {
  if (options === null || typeof options !== "object") {
    throw rangeError("IDEM-JS-1", "options must be an object with at least a store and a principal");
  }
  optionNames ??= new Set([...HOST_OPTIONS, ...engineOptionNames().split(",")]);
  for (const name of Object.keys(options)) {
    if (!optionNames.has(name)) {
      const hint = name === "scope" ? ` (${PRINCIPAL_HELP})` : "";
      throw rangeError("IDEM-JS-1", `unknown option "${name}"${hint}`);
    }
  }
  const store = options.store;
  const usable =
    store != null &&
    (typeof store.claim === "function" || typeof store.load === "function") &&
    typeof store.apply === "function";
  if (!usable) {
    throw rangeError("IDEM-JS-1", "options.store must implement load(key) and apply(key, write, now)");
  }
  if (options.principal !== "none" && typeof options.principal !== "function") {
    throw rangeError("IDEM-SCOPE-3", PRINCIPAL_HELP);
  }
  if (options.keyHeader !== undefined && (typeof options.keyHeader !== "string" || !HEADER_NAME.test(options.keyHeader))) {
    throw rangeError("IDEM-JS-1", "options.keyHeader must be a header name");
  }
  for (const fn of ["route", "onEvent", "now", "problem"]) {
    if (options[fn] !== undefined && typeof options[fn] !== "function") {
      throw rangeError("IDEM-JS-1", `options.${fn} must be a function`);
    }
  }
}

/** The engine options, as text: what a Durable Object needs to build the same engine. The
 * object claims and answers at once; waiting for a request in flight is the worker's. */
function engineOptionsText(options) {
  const out = {};
  for (const name of engineOptionNames().split(",")) {
    if (options[name] !== undefined && name !== "inFlight") out[name] = options[name];
  }
  return JSON.stringify(out);
}

/**
 * The engine for these options (the engine options; other members are ignored). Throws a
 * RangeError (IDEM-JS-1; IDEM-TTL-2 when `keyTtl < responseTtl`; IDEM-LEASE-4 when
 * `lease > keyTtl`).
 */
export function createEngine(options) {
  return new Engine(options);
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
  #principal;
  #onEvent;
  #now;
  #fingerprintHeaders;
  #route;
  #clientHeader;
  #keyHeader;
  #problem;

  constructor(options) {
    checkOptions(options);
    const store = options.store;
    // A store that cannot keep every response says how large a response it keeps
    // (IDEM-STORE-5): larger responses are kept as a response-not-stored answer.
    const limits = typeof store.maxResponseBytes === "number" && options.maxResponseBytes === undefined ? { maxResponseBytes: store.maxResponseBytes } : {};
    this.#engine = createEngine({ ...options, ...limits });
    this.#optionsText = engineOptionsText({ ...options, ...limits });
    this.#store = store;
    this.#records = recordsOf(store);
    this.#principal = options.principal === "none" ? null : options.principal;
    this.#onEvent = options.onEvent ?? null;
    this.#now = options.now ?? Date.now;
    this.#fingerprintHeaders = (options.fingerprint?.headers ?? []).map((h) => String(h).toLowerCase());
    this.#route = options.route;
    this.#keyHeader = (options.keyHeader ?? "idempotency-key").toLowerCase();
    this.#problem = options.problem ?? null;
    const clientHeader = options.timeKeys?.clientHeader;
    if (clientHeader !== undefined && (typeof clientHeader !== "string" || !HEADER_NAME.test(clientHeader))) {
      throw rangeError("IDEM-JS-1", "options.timeKeys.clientHeader must be a header name");
    }
    this.#clientHeader = options.keyKind === "unix-time" ? clientHeader?.toLowerCase() : undefined;
  }

  /** The key of a request with key header value `key` and headers `headers`: with
   * `timeKeys.clientHeader`, that header's value goes before the timestamp
   * (`client:millis`), so that clients sending bare timestamps never collide. */
  keyOf(key, headers) {
    if (this.#clientHeader === undefined || key === null || key === undefined) return key;
    const client = headers.get(this.#clientHeader);
    return client === null ? key : `${client.trim()}:${key.trim()}`;
  }

  /** The header that carries the key (`options.keyHeader`, default `idempotency-key`),
   * lower case. */
  get keyHeader() {
    return this.#keyHeader;
  }

  /** The engine's reply `{ status, headers, body, replayed }` as a Fetch Response: a refusal
   * through `options.problem` when given (see `mappedRefusal`). */
  responseOf(reply) {
    return this.mappedRefusal(reply) ?? toResponse(reply);
  }

  /** For a refusal of the engine's own (not a replay, not the handler's answer), the
   * Response `options.problem` maps its RFC 9457 problem to, in the host's own error
   * format; undefined when there is no such hook or the reply is not a refusal. */
  mappedRefusal(reply) {
    if (this.#problem === null || reply.replayed || reply.executed || reply.status < 400) return undefined;
    let problem;
    try {
      problem = JSON.parse(textDecoder.decode(reply.body));
    } catch {
      problem = { status: reply.status };
    }
    const mapped = this.#problem(problem, reply);
    return mapped instanceof Response ? mapped : undefined;
  }

  /** The `route` option: how `withIdempotency` names a request's route. */
  get route() {
    return this.#route;
  }

  /** Whether a request with this method (and a key, or not) is protected; others go
   * straight to the handler. */
  protects(method, hasKey) {
    return this.#engine.protects(method, hasKey);
  }

  /** The principal the host states for `request` (undefined for a single-tenant host):
   * what `options.principal` returns, as a string; anything else is empty, which the
   * engine refuses (IDEM-SCOPE-3). */
  async principalOf(request, ...rest) {
    if (this.#principal === null) return undefined;
    const p = await this.#principal(request, ...rest);
    return typeof p === "string" ? p : typeof p === "number" ? String(p) : "";
  }

  #emit(slot, extra) {
    const engine = this.#engine;
    for (let i = engine.event(slot); i >= 0; i = engine.event(slot)) {
      const name = eventName(i);
      let key = null;
      try {
        key = engine.key(slot) || null;
      } catch {}
      const event = { name, key, securityRelevant: securityRelevant(i), ...extra };
      if (name === "rejected") {
        const code = engine.refusalCode(slot);
        if (code !== undefined) event.code = code;
      }
      try {
        this.#onEvent(event);
      } catch {
        // A failing hook never changes how a request is answered.
      }
    }
  }

  /**
   * Handles one request given as plain data:
   * `{ method, target, route?, key, lowWater?, contentType?, headers?, body? }` (plus
   * whatever `options.principal` reads), where `target` is the path and query, `key` the
   * raw `Idempotency-Key` header value (or null), `lowWater` the raw
   * `Idempotency-Low-Water` header value of a counter client, `headers` a Headers object,
   * pair list or record (only the fingerprint headers are read) and `body` a Uint8Array.
   * `run(context)` executes the handler and returns `{ status, headers?, body? }`. Resolves
   * to `{ status, headers, body, replayed, executed }` with headers as a flat
   * `[name, value, …]` list; `executed` is true for the answer of `run`, false for the
   * engine's own (a replay or a refusal).
   */
  async handle(input, run) {
    const target = input.target;
    const slot = this.begin(
      input.key,
      await this.principalOf(input),
      input.method,
      input.route ?? routeOf(target),
      target,
      input.contentType,
      input.headers,
      input.body ?? EMPTY,
      input.lowWater,
    );
    return this.serve(slot, plainReply, async (context) => {
      let out;
      try {
        out = await run(context);
      } catch (err) {
        await context.finish(Ran.Threw, 0, null, EMPTY);
        throw err;
      }
      let headers;
      let body;
      try {
        if (out === null || typeof out !== "object") throw new TypeError("run(context) must return { status, headers?, body? }");
        headers = flatHeaders(out.headers);
        body = typeof out.body === "string" ? textEncoder.encode(out.body) : (out.body ?? EMPTY);
      } catch (err) {
        await context.finish(Ran.Threw, 0, null, EMPTY);
        throw err;
      }
      // The memory store answers at once; other stores answer with a promise.
      let instead = context.finish(Ran.Answered, out.status, headers, body);
      if (instead instanceof Promise) instead = await instead;
      if (instead !== null) return plainReply(instead);
      return { status: out.status, headers, body, replayed: false, executed: true };
    });
  }

  /** Identifies a request and opens its slot (an integer). A request that cannot be
   * identified (no or a malformed key, an unusable body, no principal) gets a slot too: its
   * first step is its refusal. `headers` is only read for the fingerprint headers;
   * `lowWater` is a counter client's low-water mark (or undefined). */
  begin(key, principal, method, route, target, contentType, headers, body, lowWater) {
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
    return this.#engine.begin(
      key ?? undefined,
      principal,
      method,
      route,
      target,
      contentType ?? undefined,
      selected,
      body,
      lowWater ?? undefined,
      random32(),
      random32(),
    );
  }

  /**
   * Issues a one-time token (`keyKind: "token"`) for the caller of `request` (whatever
   * `options.principal` reads from it) to spend on `method` (default POST) to `route`, and
   * stores it. Resolves to `{ token, expires }` (expires: ms since the epoch; unused, the
   * token is refused as expired after that). See `tokenResponse` for the endpoint. Throws
   * the engine's refusal as an error with its `code` (IDEM-SCOPE-3 for an empty principal).
   */
  async issueToken(request, { route, method = "POST" } = {}) {
    const document = await this.#operate(await this.#tokenSlot(request, route, method));
    return { token: document.token, expires: document.expiresAt };
  }

  /**
   * The documented token endpoint (for example `POST /idempotency-tokens`): issues a token
   * for `route` and answers with the engine's reply, 201 `{ "expiresAt": ms, "token":
   * "tok_…", "ttl": ms }`, never cached, or its problem (an empty principal).
   */
  async tokenResponse(request, { route, method = "POST" } = {}) {
    return this.serve(await this.#tokenSlot(request, route, method), (reply) => this.responseOf(reply));
  }

  async #tokenSlot(request, route, method) {
    if (typeof route !== "string") throw rangeError("IDEM-JS-1", "a token needs { route }: the route it is for");
    const principal = await this.principalOf(request);
    return this.#engine.issueToken(principal, method.toUpperCase(), route, this.#now(), random32(), random32(), random32(), random32());
  }

  /**
   * Opens the counter session (`keyKind: "counter"`) of `client` for the caller of
   * `request`, for `method` (default POST) to `route`, with `firstSeq` (default 0) as its
   * first sequence number; on a live session, moves it to its next epoch (the old epoch's
   * requests are refused from then on). Resolves to `{ client, epoch, firstSeq }`, the
   * numbers as decimal text (they may not fit a JavaScript number). Throws the engine's
   * refusal as an error with its `code` (IDEM-CTR-1 for a bad client id or first number).
   */
  async openSession(request, { route, client, firstSeq = 0, method = "POST" } = {}) {
    if (typeof route !== "string") throw rangeError("IDEM-JS-1", "openSession needs { route }: the route the session is for");
    if (typeof client !== "string") throw rangeError("IDEM-CTR-1", "openSession needs { client }: the client id");
    const principal = await this.principalOf(request);
    // Decimal text, so that 64-bit numbers (a BigInt) cross whole; the engine refuses
    // anything else (IDEM-CTR-1).
    const slot = this.#engine.openSession(principal, method.toUpperCase(), route, client, String(firstSeq), random32(), random32());
    return this.#operate(slot);
  }

  /**
   * The documented session endpoint (for example `POST /sessions`): reads `{"client": "…",
   * "firstSeq": n}` from the body of `request` and opens that session for `route`, answering
   * with the engine's reply: 201 `{ "client", "epoch", "firstSeq" }`, or its problem (400 for
   * a body that is not such an object or a bad first number or client id).
   */
  async sessionResponse(request, { route, method = "POST" } = {}) {
    if (typeof route !== "string") throw rangeError("IDEM-JS-1", "sessionResponse needs { route }: the route the session is for");
    const principal = await this.principalOf(request);
    const body = new Uint8Array(await request.arrayBuffer());
    const slot = this.#engine.openSessionFrom(principal, method.toUpperCase(), route, body, random32(), random32());
    return this.serve(slot, (reply) => this.responseOf(reply));
  }

  /** Drives an operation's slot (a token, a session) to its reply: its JSON document, or
   * the refusal thrown with the requirement it cites as its `code`. */
  async #operate(slot) {
    const engine = this.#engine;
    return this.serve(slot, (reply) => {
      if (reply.status >= 200 && reply.status < 300) return JSON.parse(textDecoder.decode(reply.body));
      const problem = JSON.parse(textDecoder.decode(reply.body));
      const err = reply.status >= 500 ? new Error(problem.detail) : new RangeError(problem.detail);
      err.code = engine.refusalCode(slot) ?? (reply.status === 500 ? "IDEM-JS-1" : `HTTP-${reply.status}`);
      throw err;
    });
  }

  /** One delivery `{ source, id, contentType?, body }` to this engine's inbox, processed by
   * `process(context)` when it is the first (see `Inbox#receive`). */
  async deliver(message, process) {
    const engine = this.#engine;
    const slot = engine.deliver(message.source, message.id, message.contentType ?? undefined, message.body, random32(), random32());
    return this.serve(
      slot,
      (reply) => delivered(engine, slot, reply),
      async (context) => {
        try {
          await process({ source: message.source, id: message.id, recovered: context.recovered, fence: context.fence });
        } catch (err) {
          await context.finish(Ran.Threw, 0, null, EMPTY);
          throw err;
        }
        let instead = context.finish(Ran.Processed, 0, null, EMPTY);
        if (instead instanceof Promise) instead = await instead;
        return delivered(engine, slot, instead ?? takeReply(engine, slot));
      },
    );
  }

  /** A slot answering 413 for a body of `length` bytes announced before it is read, or
   * undefined when it may be read (IDEM-LIMIT-1). */
  refuseBody(length) {
    return this.#engine.refuseBody(length);
  }

  /** Drives the slot's request and answers: `execute(context)` when this request runs, or
   * `answer(reply)` with the engine's reply (replay, 409, 422, 410, 413, 503, …). Ends the
   * slot. */
  async serve(slot, answer, execute) {
    const engine = this.#engine;
    const request = { slot, busy: null, ended: false, outcome: undefined };
    try {
      for (;;) {
        // The memory store answers at once: no await on the common path.
        const step = this.#records !== null ? this.#driveIn(slot) : await this.#advance(request);
        if (step === Step.WaitUntil) {
          await sleep(Math.max(0, engine.waitUntil(slot) - this.#now()));
          continue;
        }
        if (step === Step.Reply) {
          const reply = takeReply(engine, slot);
          reply.replayed = isReplay(reply.headers);
          return answer(reply);
        }
        if (step !== Step.Run) throw new Error(`idem: unexpected step ${Step[step]}`);
        const context = new RunContext(
          engine,
          request,
          (ran, status, headers, body) => this.#finish(request, ran, status, headers, body),
          (context) => this.#extend(request, context),
        );
        return await execute(context);
      }
    } finally {
      request.ended = true;
      // A store that keeps something for an attempt (a handler's transaction) lets go of it
      // when the attempt's request is over, however it ended (IDEM-STORE-7).
      const store = this.#store;
      const key = request.attempt !== undefined && typeof store.end === "function" ? engine.storageKey(slot) : null;
      const close = () => {
        engine.end(slot);
        if (key !== null) {
          try {
            Promise.resolve(store.end(key, request.attempt)).catch(() => {});
          } catch {
            // A store's failure to let go is its own; the answer stands.
          }
        }
      };
      // A heartbeat or completion still on its way ends the slot when it is done.
      if (request.busy === null) close();
      else request.busy.finally(close);
    }
  }

  /** Polls and performs the store steps until the machine asks for something else: run,
   * wait, reply, done, or an input (idle). One pump per request at a time, so that a
   * heartbeat and a completion are written one after the other, as the machine orders them. */
  async #advance(request) {
    if (this.#records !== null) return this.#driveIn(request.slot);
    while (request.busy !== null) await request.busy;
    const run = this.#pump(request);
    request.busy = run.then(
      () => {},
      () => {},
    );
    try {
      return await run;
    } finally {
      request.busy = null;
    }
  }

  async #pump(request) {
    const slot = request.slot;
    const engine = this.#engine;
    const store = this.#store;
    for (;;) {
      const step = engine.poll(slot, this.#now());
      if (this.#onEvent !== null) this.#emit(slot);
      if (step !== Step.Claim && step !== Step.Load && step !== Step.Apply) return step;
      try {
        if (step === Step.Apply) {
          const write = takeWrite(engine, slot);
          // The completion says so, and whose it is: a store that commits it in the
          // handler's own transaction (PostgresStore#transaction) tells it from a heartbeat,
          // and one attempt's transaction from another's.
          const info = request.outcome === undefined ? undefined : { outcome: request.outcome, fence: engine.fence(slot), attempt: request.attempt };
          const applied = await store.apply(engine.storageKey(slot), write, this.#now(), info);
          engine.applied(slot, this.#now(), applied === true);
        } else if (step === Step.Claim && typeof store.claim === "function") {
          const bytes = await store.claim(engine.storageKey(slot), engine.ticket(slot), this.#optionsText, this.#now(), random32(), random32());
          engine.claimed(slot, this.#now(), bytes);
        } else {
          const current = await store.load(engine.storageKey(slot));
          engine.record(slot, this.#now(), current?.value ?? undefined);
        }
      } catch (err) {
        if (err?.code === "IDEM-REC-1" || err?.code === "IDEM-JS-2") throw err;
        engine.storeFailed(slot, err?.code === "IDEM-STORE-3");
        if (this.#onEvent !== null) this.#emit(slot, { error: err });
      }
    }
  }

  /** Records the handler's outcome (IDEM-OUT-5: before the response leaves). With the
   * memory store it is done at once; otherwise it returns a promise. Its result is null
   * when the handler's answer goes out, or the engine's reply to send instead when another
   * attempt took the lease over (IDEM-LEASE-5: the key's outcome, never this attempt's). */
  #finish(request, ran, status, headers, body) {
    const engine = this.#engine;
    request.outcome = ran === Ran.Threw ? "threw" : "answered";
    engine.outcome(request.slot, ran, status, headers === null ? "" : listText(headers), body);
    if (this.#records !== null) return this.#instead(request, this.#driveIn(request.slot));
    return this.#advance(request).then((step) => this.#instead(request, step));
  }

  /** After the outcome: the reply that replaces the handler's answer, or null. */
  #instead(request, step) {
    if (step !== Step.Done) return null;
    const reply = takeReply(this.#engine, request.slot);
    if (reply !== null) reply.replayed = isReplay(reply.headers);
    return reply;
  }

  /** Every store step in the memory store, at once. */
  #driveIn(slot) {
    const step = this.#engine.driveIn(this.#records, slot, this.#now());
    if (this.#onEvent !== null) this.#emit(slot);
    return step;
  }

  async #extend(request, context) {
    const engine = this.#engine;
    if (request.ended) throw rangeError("IDEM-LEASE-3", "the request is over: its lease has ended");
    const refused = engine.heartbeat(request.slot, this.#now());
    if (refused === HeartbeatState.Quiet) await this.#advance(request);
    const state = refused === HeartbeatState.Quiet ? engine.heartbeatState(request.slot) : refused;
    if (state === HeartbeatState.Extended) {
      context.leaseExpires = engine.leaseExpires(request.slot);
      return;
    }
    if (state === HeartbeatState.FencedOut) throw rangeError("IDEM-LEASE-2", "the lease was taken over by another attempt");
    if (state === HeartbeatState.Expired) throw rangeError("IDEM-LEASE-3", "the lease had ended before the heartbeat");
    const err = new Error("the idempotency store failed; the lease may not have been extended");
    err.code = "IDEM-STORE-4";
    throw err;
  }
}

/** What a handler runs with: its key, whether it recovers from an attempt whose lease
 * ended, the fence and end of its lease, and `extend()`. `finish` and `storageKey` are not
 * the handler's data: they sit on the prototype, so they are not enumerated (and a class
 * instance is made far faster than an object given properties one by one). */
class RunContext {
  #engine;
  #request;
  #finish;
  constructor(engine, request, finish, extend) {
    // One call for the four, not one each.
    const { key, recovered, fence, leaseExpires, attempt } = takeContext(engine, request.slot);
    this.key = key;
    this.recovered = recovered;
    this.fence = fence;
    this.leaseExpires = leaseExpires;
    request.attempt = attempt;
    // Its own property, so that `const { extend } = context` works.
    this.extend = () => extend(this);
    this.#engine = engine;
    this.#request = request;
    this.#finish = finish;
  }

  /** Records the handler's outcome (what the adapters call once the handler is done). */
  finish(ran, status, headers, body) {
    return this.#finish(ran, status, headers, body);
  }

  /** The record's storage key, for a handler that asks for it (PostgresStore#transaction). */
  get storageKey() {
    if (this.#request.ended) throw rangeError("IDEM-LEASE-3", "the request is over");
    return this.#engine.storageKey(this.#request.slot);
  }

  /** This attempt's identity (16 hex digits), unique across every attempt at every key: what
   * a store keys something it keeps for the attempt by (PostgresStore#transaction). */
  get attempt() {
    return this.#request.attempt;
  }

  /** `new Response(body, init)`, whose bytes `withIdempotency` stores as they were given,
   * without reading the body back, and which it returns as it is (IDEM-JS-5). */
  respond(body, init) {
    const response = new Response(body, init);
    const bytes = bytesNow(body);
    // The response took its own copy of a buffer; so does the record, so that a buffer the
    // handler changes afterwards changes neither. Streams, blobs and forms are read back.
    if (bytes !== undefined) builtBodies.set(response, ArrayBuffer.isView(body) || body instanceof ArrayBuffer ? bytes.slice() : bytes);
    return response;
  }

  /** `Response.json(value, init)`, stored as `respond` stores its body. */
  json(value, init) {
    const text = JSON.stringify(value);
    if (text === undefined) throw new TypeError("the value has no JSON form");
    const headers = new Headers(init?.headers);
    if (!headers.has("content-type")) headers.set("content-type", "application/json");
    return this.respond(text, { ...init, headers });
  }
}

const textEncoder = new TextEncoder();
const textDecoder = new TextDecoder();

/** Whether a reply's flat header list carries the replay marker (a replay ends with it). */
function isReplay(headers) {
  return headers.length >= 2 && headers[headers.length - 2] === "idempotent-replayed";
}

function plainReply(reply) {
  reply.executed = false;
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
  return new Response(NULL_BODY_STATUS.has(reply.status) ? null : reply.body, { status: reply.status, headers: pairsOf(reply.headers) });
}

/** A flat `[name, value, …]` list as the `[name, value]` pairs a Response takes: the
 * runtime copies them once, where a Headers object built first is checked and copied
 * twice. */
function pairsOf(flat) {
  const pairs = [];
  for (let i = 0; i < flat.length; i += 2) pairs.push([flat[i], flat[i + 1]]);
  return pairs;
}

/**
 * Wraps a Fetch handler `(request, ...rest) => Response` with Idempotency-Key semantics.
 * Guarded requests (POST and PATCH by default) with a key are claimed before the handler
 * runs; a retry gets the stored response with `Idempotent-Replayed: true`; a duplicate in
 * flight gets 409 with `Retry-After` (or waits, with `inFlight: { wait }`); a changed payload
 * gets 422; a bad key or body gets 400/413. All refusals are `application/problem+json`.
 * The response is stored before it is returned. `options.principal` says who sent each
 * request (see `Idempotency`).
 */
export function withIdempotency(handler, options) {
  if (typeof handler !== "function") throw rangeError("IDEM-JS-1", "handler must be a function");
  // An Idempotency of its own, or one the caller also uses (to issue tokens, open sessions).
  const idem = options instanceof Idempotency ? options : new Idempotency(options);
  const route = options.route ?? null;
  const answer = (reply) => idem.responseOf(reply);
  return async function idempotent(request, ...rest) {
    const method = request.method;
    const headers = request.headers;
    const key = idem.keyOf(headers.get(idem.keyHeader), headers);
    if (!idem.protects(method, key !== null)) return handler(request, ...rest);
    const length = headers.get("content-length");
    const tooLarge = length === null ? undefined : idem.refuseBody(Number(length));
    if (tooLarge !== undefined) return idem.serve(tooLarge, answer);
    let body = EMPTY;
    if (request.body !== null) {
      // A declared length was checked above; a body without one (chunked) is read only up
      // to the limit, so an endless upload cannot fill the isolate's memory.
      if (length !== null) {
        body = new Uint8Array(await request.arrayBuffer());
      } else {
        const read = await readCapped(request.body, idem);
        if (typeof read === "number") return idem.serve(read, answer);
        body = read;
      }
    }
    const href = request.url;
    const target = targetOf(href);
    const slot = idem.begin(
      key,
      await idem.principalOf(request, ...rest),
      method,
      route ? await route(request, new URL(href)) : routeOf(target),
      target,
      headers.get("content-type"),
      headers,
      body,
      headers.get(lowWaterName()) ?? undefined,
    );
    return idem.serve(slot, answer, async (context) => {
      // The handler gets a request it can read: the body was read for the fingerprint.
      const forHandler = request.body !== null ? new Request(request, { body }) : request;
      contexts.set(forHandler, context);
      let response;
      let bytes;
      let built;
      try {
        response = await handler(forHandler, ...rest);
        if (!(response instanceof Response)) throw rangeError("IDEM-JS-1", "the handler must return a Response");
        built = response.bodyUsed ? undefined : builtBodies.get(response);
        // The body is read to store it, unless the context built it (IDEM-JS-5): no await
        // on the body, so writes the handler left pending go to storage with the completion.
        // A body that fails is a failed attempt, like a throw.
        bytes =
          NULL_BODY_STATUS.has(response.status) || response.body === null
            ? null
            : (built ?? new Uint8Array(await response.arrayBuffer()));
      } catch (err) {
        await context.finish(Ran.Threw, 0, null, EMPTY);
        throw err;
      }
      let instead = context.finish(Ran.Answered, response.status, flatHeaders(response.headers), bytes ?? EMPTY);
      if (instead instanceof Promise) instead = await instead;
      if (instead !== null) return answer(instead);
      // A body that was read to store it is given to the caller again, in a new response.
      return bytes === null || built !== undefined
        ? response
        : new Response(bytes, { status: response.status, statusText: response.statusText, headers: response.headers });
    });
  };
}

/** Reads a stream while the engine allows its size: the bytes, or (the stream cancelled)
 * the slot that answers 413. */
async function readCapped(stream, idem) {
  const reader = stream.getReader();
  const chunks = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.byteLength;
    const refused = idem.refuseBody(total);
    if (refused !== undefined) {
      await reader.cancel().catch(() => {});
      return refused;
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

const INBOX_OPTIONS = ["store", "responseTtl", "keyTtl", "lease", "unknownOutcome", "fingerprint", "onEvent", "now"];

let deliveries = null;
/** A delivery outcome's name and whether its sender is told it was received (the core's). */
function deliveryOf(index) {
  deliveries ??= { names: deliveryNames().split(","), acknowledged: acknowledgedMask() };
  return { outcome: deliveries.names[index], acknowledge: (deliveries.acknowledged & (1 << index)) !== 0 };
}

/**
 * A receiver's inbox (webhooks, at-least-once queues): the first delivery of a message is
 * processed, redeliveries are acknowledged without processing. A message is named by its
 * source (the sender) and the id the source gives it. Each delivery is an operation of the
 * engine's request machine, as in every host: its record (under `<source>#inbox` and the
 * id) is claimed before processing and stored as processed after, and what became of it is
 * the engine's, never read back from a reply.
 */
export class Inbox {
  #idem;

  constructor(options) {
    if (options === null || typeof options !== "object") throw rangeError("IDEM-JS-1", "options must be an object with a store");
    for (const name of Object.keys(options)) {
      if (!INBOX_OPTIONS.includes(name)) throw rangeError("IDEM-JS-1", `unknown option "${name}"`);
    }
    // The key retention is how long a message id is remembered: it must outlast the
    // source's redelivery horizon.
    this.#idem = new Idempotency({ ...options, principal: "none" });
  }

  /**
   * Receives one delivery `{ source, id, body?, contentType? }` (body: the payload bytes or
   * text, so that the same id with another payload is a conflict; a JSON payload is
   * compared canonically) and runs `process(context)` for the first one. Resolves to
   * `{ outcome, acknowledge, retryAfter?, response }`: `processed` (it ran now),
   * `duplicate` (already processed, also after its stored answer expired while its id is
   * remembered: acknowledge and do nothing, IDEM-INBOX-1), `in-progress` (another delivery
   * is being processed: do not acknowledge, so that the source sends it again,
   * IDEM-INBOX-2), `conflict` (the id came with another payload: acknowledged, not
   * processed; log it, IDEM-INBOX-3), `held` (an earlier delivery's outcome is unknown and
   * held), `refused` (a malformed id, or the store failed); `response` is the engine's
   * receipt to answer the sender with. If `process` throws, the error is rethrown (answer
   * the source with an error: it redelivers, and the next delivery runs as `recovered`).
   */
  async receive({ source, id, body, contentType }, process) {
    if (typeof source !== "string" || source === "" || typeof id !== "string") {
      throw rangeError("IDEM-JS-1", "receive needs { source, id }: the sender and its message id");
    }
    if (contentType !== undefined && typeof contentType !== "string") throw rangeError("IDEM-JS-1", "contentType must be a string");
    const bytes = typeof body === "string" ? textEncoder.encode(body) : (body ?? EMPTY);
    return this.#idem.deliver({ source, id, contentType, body: bytes }, process);
  }
}

/** What became of the delivery in `slot`, with its receipt `reply`. */
function delivered(engine, slot, reply) {
  const { outcome, acknowledge } = deliveryOf(engine.delivery(slot));
  const result = { outcome, acknowledge, response: toResponse(reply) };
  const retryAfter = headerOf(reply, "retry-after");
  if (retryAfter !== undefined) result.retryAfter = Number(retryAfter);
  return result;
}

function headerOf(reply, name) {
  for (let i = 0; i < reply.headers.length; i += 2) if (reply.headers[i] === name) return reply.headers[i + 1];
  return undefined;
}
