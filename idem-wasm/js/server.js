// The server side: the `Idempotency` class, the engine bound to a store and the host's
// settings. It identifies requests and opens the engine's operations (a guarded request, a
// token, a session, an inbox delivery), each in a slot that the drive loop (drive.js) serves.
// `withIdempotency` (fetch.js) and the framework adapters are built on it.
//
// Every rule is idem-core's request machine (compiled to WebAssembly): this file only moves
// data.
//
// One class, `Idempotency`, and its methods: the drive loop, the Fetch wrapper and the
// inbox are in files of their own. It is as long as the API it offers the adapters and the
// hosts (the key, the body limit, the status queries, the token, session and inbox
// operations), each method a few lines that open one operation's slot.
import { Ran, keyHeader, lowWaterHeader, statusHeader } from "./idem_wasm.js";
import { recordsOf } from "./stores.js";
import { random32 } from "./common.js";
import { Driver } from "./drive.js";
import { delivered } from "./inbox.js";
import { HEADER_NAME, checkOptions, createEngine, engineOptionsText } from "./options.js";
import { Telemetry } from "./telemetry.js";
import { flatHeaders, givenBytes, listText, rangeError, takeReply, toResponse, wellFormed } from "./util.js";

const EMPTY = new Uint8Array(0);
let lowWaterName = null;
let statusName = null;
const textDecoder = new TextDecoder();

/**
 * The engine bound to a store and the host's settings. `withIdempotency` wraps a Fetch
 * handler with one; hosts that are not Fetch-shaped (an Express adapter, a queue consumer)
 * call `handle` with plain objects.
 */
export class Idempotency {
  #engine;
  #driver;
  #principal;
  #now;
  #fingerprintHeaders;
  #route;
  #clientHeader;
  #keyHeader;
  #problem;
  #statusQueries;

  constructor(options) {
    checkOptions(options);
    const store = options.store;
    // A store that cannot keep every response says how large a response it keeps
    // (IDEM-STORE-5): larger responses are kept as a response-not-stored answer.
    const limits = typeof store.maxResponseBytes === "number" && options.maxResponseBytes === undefined ? { maxResponseBytes: store.maxResponseBytes } : {};
    this.#engine = createEngine({ ...options, ...limits });
    this.#now = options.now ?? Date.now;
    const optionsText = engineOptionsText({ ...options, ...limits });
    const telemetry = options.telemetry === undefined ? null : new Telemetry(options.telemetry);
    this.#driver = new Driver(this.#engine, store, recordsOf(store), optionsText, this.#now, options.onEvent ?? null, telemetry);
    this.#principal = options.principal === "none" ? null : options.principal;
    this.#fingerprintHeaders = (options.fingerprint?.headers ?? []).map((h) => String(h).toLowerCase());
    this.#route = options.route;
    this.#keyHeader = (options.keyHeader ?? keyHeader()).toLowerCase();
    this.#problem = options.problem ?? null;
    this.#statusQueries = options.statusQueries ?? true;
    const clientHeader = options.timeKeys?.clientHeader;
    if (clientHeader !== undefined && (typeof clientHeader !== "string" || !HEADER_NAME.test(clientHeader))) {
      throw rangeError("IDEM-JS-1", "options.timeKeys.clientHeader must be a header name");
    }
    this.#clientHeader = options.keyKind === "unix-time" ? clientHeader?.toLowerCase() : undefined;
  }

  /** The value of `timeKeys.clientHeader` among `headers` (a Headers object, pair list or
   * record), or undefined: the client of a unix-time key that names none, which the engine
   * puts before the timestamp (`client:millis`), on a request and on a status query alike. */
  #clientOf(headers) {
    const name = this.#clientHeader;
    if (name === undefined || headers == null) return undefined;
    if (typeof headers.get === "function") return headers.get(name) ?? undefined;
    const flat = flatHeaders(headers);
    for (let i = 0; i < flat.length; i += 2) if (flat[i] === name) return flat[i + 1];
    return undefined;
  }

  /** The header that carries the key (`options.keyHeader`, default `idempotency-key`),
   * lower case. */
  get keyHeader() {
    return this.#keyHeader;
  }

  /** The header that carries a counter client's low-water mark (idem-core's), lower case. */
  get lowWaterHeader() {
    lowWaterName ??= lowWaterHeader();
    return lowWaterName;
  }

  /** The field that makes a `GET` a status query (idem-core's `idempotency-status`), lower
   * case. */
  get statusHeader() {
    statusName ??= statusHeader();
    return statusName;
  }

  /** Whether the adapters answer status queries (`options.statusQueries`, default true): a
   * `GET` with `Idempotency-Status` on a route they guard. */
  get statusQueries() {
    return this.#statusQueries;
  }

  /** The largest response body the store keeps (IDEM-STORE-5): a host holds no more of a
   * response than this, and passes a longer one through (`passThrough` in `handle`). */
  get maxResponseBytes() {
    return this.#engine.maxResponseBytes;
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

  /** Whether a request with this method (and a key or not) needs its body to be identified:
   * it is protected and has a key, or its key would be derived from its body. A protected
   * request without a key is otherwise refused before its body matters. */
  readsBody(method, hasKey) {
    return this.#engine.readsBody(method, hasKey);
  }

  /** The principal the host states for `request` (undefined for a single-tenant host):
   * what `options.principal` returns, as a string; anything else is empty, which the
   * engine refuses (IDEM-SCOPE-3), and so is a string with a lone surrogate (a user id
   * parsed from `"\ud800"`): in the module it would be the same principal as any other
   * with U+FFFD there. */
  async principalOf(request, ...rest) {
    if (this.#principal === null) return undefined;
    const p = await this.#principal(request, ...rest);
    return typeof p === "string" ? (wellFormed(p) ? p : "") : typeof p === "number" ? String(p) : "";
  }

  /**
   * Handles one request given as plain data:
   * `{ method, target, route?, key, lowWater?, contentType?, headers?, body? }` (plus
   * whatever `options.principal` reads), where `target` is the path and query, `key` the
   * raw `Idempotency-Key` header value (or null), `lowWater` the raw
   * `Idempotency-Low-Water` header value of a counter client, `headers` a Headers object,
   * pair list or record (only the fingerprint headers are read) and `body` bytes or text
   * (a Uint8Array, another typed array, a DataView, an ArrayBuffer or a string; anything
   * else is refused, IDEM-JS-1).
   * `run(context)` executes the handler and returns `{ status, headers?, body? }`, or
   * `{ status, headers?, passThrough: true }` for an answer whose body grew past
   * `maxResponseBytes` and that the caller sends itself as it is produced (IDEM-STORE-5: it
   * is recorded as too large to keep), with `trailed: true` for one that ends with trailer
   * fields, which a stored answer does not carry (recorded as not kept either). Resolves to `{ status, headers, body, replayed,
   * executed }` with headers as a flat `[name, value, …]` list; `executed` is true for the
   * answer of `run`, false for the engine's own (a replay or a refusal), and `passThrough`
   * (with `body` null) when the caller is to send the rest of `run`'s answer.
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
      givenBytes(input.body, "input.body"),
      input.lowWater,
    );
    return this.serve(slot, plainReply, async (context) => {
      let out;
      try {
        out = await run(context);
      } catch (err) {
        // Any failure goes on, but an answer that stalled past the lease (IDEM-OUT-7).
        return plainReply(await context.threw(err));
      }
      let headers;
      let body;
      try {
        if (out === null || typeof out !== "object") throw new TypeError("run(context) must return { status, headers?, body? }");
        headers = flatHeaders(out.headers);
        body = out.passThrough === true ? null : givenBytes(out.body, "the body run(context) returns");
      } catch (err) {
        await context.finish(Ran.Threw, 0, null, EMPTY);
        throw err;
      }
      // The memory store answers at once; other stores answer with a promise.
      const ran = body !== null ? Ran.Answered : out.trailed === true ? Ran.Trailed : Ran.Oversized;
      let instead = context.finish(ran, out.status, headers, body ?? EMPTY);
      if (instead instanceof Promise) instead = await instead;
      if (instead !== null) return plainReply(instead);
      if (body === null) return { status: out.status, headers, body, replayed: false, executed: true, passThrough: true };
      return { status: out.status, headers, body, replayed: false, executed: true };
    });
  }

  /**
   * Answers a status query given as plain data (IDEM-STATUS-1): `{ target, route?, key,
   * status, headers? }` (plus whatever `options.principal` reads), where `key` is the raw
   * `Idempotency-Key` header value, `headers` the request's (only `timeKeys.clientHeader` is
   * read) and `status` the raw `Idempotency-Status` value, naming
   * the method of the request asked about (`POST`, or `POST; settle` to settle a key never
   * seen so that it never runs). Resolves to `{ status, headers, body }` as `handle` does:
   * 200 with what became of the key (`application/vnd.idem.key-status+json`: completed,
   * in-progress, released, held, expired, unknown, not-executed), in the asker's scope only,
   * or the core's problem. Nothing runs and nothing is claimed.
   */
  async status(input) {
    const route = input.route ?? routeOf(input.target);
    const slot = this.statusSlot(input.key, await this.principalOf(input), route, input.status, input.headers);
    return this.serve(slot, plainReply);
  }

  /** Opens the slot of a status query: `key` and `field` are the raw header values, and
   * `headers` the request's (only `timeKeys.clientHeader` is read). */
  statusSlot(key, principal, route, field, headers) {
    const slot = this.#engine.status(principal, route, key ?? undefined, field ?? "", this.#clientOf(headers), random32(), random32());
    // A route is a span's `http.route` only when the host names routes: a raw path may
    // carry ids.
    this.#driver.describe(slot, "GET", this.#route === undefined ? undefined : route);
    return slot;
  }

  /** Identifies a request and opens its slot (an integer). A request that cannot be
   * identified (no or a malformed key, an unusable body, no principal) gets a slot too: its
   * first step is its refusal. `headers` is only read for the fingerprint headers and
   * `timeKeys.clientHeader`; `lowWater` is a counter client's low-water mark (or undefined). */
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
    const slot = this.#engine.begin(
      key ?? undefined,
      principal,
      method,
      route,
      target,
      contentType ?? undefined,
      selected,
      body,
      lowWater ?? undefined,
      this.#clientOf(headers),
      random32(),
      random32(),
    );
    this.#driver.describe(slot, method, this.#route === undefined ? undefined : route);
    return slot;
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
    const upper = operationOf("a token", route, method);
    const principal = await this.principalOf(request);
    return this.#engine.issueToken(principal, upper, route, this.#now(), random32(), random32(), random32(), random32());
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
    const upper = operationOf("openSession", route, method);
    if (typeof client !== "string") throw rangeError("IDEM-CTR-1", "openSession needs { client }: the client id");
    const principal = await this.principalOf(request);
    // Decimal text, so that 64-bit numbers (a BigInt) cross whole; the engine refuses
    // anything else (IDEM-CTR-1).
    const slot = this.#engine.openSession(principal, upper, route, client, String(firstSeq), random32(), random32());
    return this.#operate(slot);
  }

  /**
   * The documented session endpoint (for example `POST /sessions`): reads `{"client": "…",
   * "firstSeq": n}` from the body of `request` and opens that session for `route`, answering
   * with the engine's reply: 201 `{ "client", "epoch", "firstSeq" }`, or its problem (400 for
   * a body that is not such an object or a bad first number or client id).
   */
  async sessionResponse(request, { route, method = "POST" } = {}) {
    const upper = operationOf("sessionResponse", route, method);
    const principal = await this.principalOf(request);
    const body = new Uint8Array(await request.arrayBuffer());
    const slot = this.#engine.openSessionFrom(principal, upper, route, body, random32(), random32());
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
          // A long processing keeps its lease with heartbeats, as a handler does.
          await process({
            source: message.source,
            id: message.id,
            recovered: context.recovered,
            fence: context.fence,
            get leaseExpires() {
              return context.leaseExpires;
            },
            extend: context.extend,
          });
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
  serve(slot, answer, execute) {
    return this.#driver.serve(slot, answer, execute);
  }
}

function plainReply(reply) {
  reply.executed = false;
  return reply;
}

/** The route of a target: its path. */
export function routeOf(target) {
  const q = target.indexOf("?");
  return q < 0 ? target : target.slice(0, q);
}

/** The method of an operation on `route` (a token, a session), in upper case: IDEM-JS-1 for a
 * route that is not a non-empty string, or a method that is not a string. */
function operationOf(what, route, method) {
  if (typeof route !== "string" || route === "") throw rangeError("IDEM-JS-1", `${what} needs { route }: the route it is for`);
  if (typeof method !== "string") throw rangeError("IDEM-JS-1", `${what}: method must be a string such as "POST"`);
  return method.toUpperCase();
}
