// An orders API on Cloudflare Workers whose `POST /orders` is safe to retry: the idem
// package's `withIdempotency` claims each Idempotency-Key before the handler runs, stores the
// response before it is returned, and replays it to every retry.
//
// The orders live in a Durable Object, and so do their idempotency records: the worker
// forwards `POST /orders` to that object (one round trip), which claims the key, runs the
// handler and completes the key next to its own storage (DurableObjectLocalStore), and
// writes the order in the same atomic write as the stored response. Every effect of an order
// is a write of that transaction, so the claim stays in the object's memory
// (`writesOnly`, ORDER_WRITES_ONLY = "on"): a fresh order is one storage write. The other
// routes keep their data elsewhere; their keys are claimed in IdempotencyShard objects
// (DurableObjectStore), one round trip per store step.
//
//   POST /orders              create an order (Idempotency-Key required by default)
//   POST /payments            the same, keyed by the client's timestamp: "[client:]millis"
//   POST /transfers           the same, keyed by a wrapping counter: "client:epoch:seq",
//                             with Idempotency-Low-Water; the session comes from
//   POST /sessions            {"client": "…", "firstSeq": n} → 201 {"client", "epoch", "firstSeq"}
//   POST /checkout            the same, keyed by a token from
//   POST /idempotency-tokens  → 201 {"token", "expiresAt", "ttl"} (needs IDEM_TOKEN_SECRET)
//   GET  /orders (and /payments, /transfers, /checkout) with Idempotency-Status: POST and a
//                             request's Idempotency-Key: what became of that request
//                             (a status query; `POST; settle` settles a key never seen)
//   POST /webhooks/payments   a payment provider's events: each event id is processed once
//                             (one ledger entry), redeliveries are acknowledged unprocessed
//   GET  /count               how many times the order handler has run (the side-effect
//                             oracle), and how many orders were committed
//   POST /unprotected/orders  the same handler without withIdempotency, in the orders object,
//                             writing the order; for the benchmark
//   POST /unprotected/runs    the handler in the worker: validates and counts the run, writes
//                             no order; the benchmark's floor (both only with
//                             UNPROTECTED_ROUTE = "on")
//
// Bindings (wrangler.toml): IDEM, the `IdempotencyShard` Durable Object class from the
// package, one object per key shard; LEDGER, the `OrderLedger` class below, which holds the
// orders, their idempotency records and the count of handler runs. Settings come from the
// environment: see config.js. The order handler itself is in orders.js.
//
// From an installed package this import is `from "idem"`; wrangler's bundler picks the
// package's "workerd" entry. Here it names that entry in the package being built next door.
import { DurableObject } from "cloudflare:workers";
import {
  DurableObjectLocalStore,
  DurableObjectStore,
  Idempotency,
  IdempotencyShard as Shard,
  Inbox,
  methodNotAllowed,
  plainProblem,
  statusHeader,
  withIdempotency,
} from "../../../dist/workerd.js";
import { ConfigError, configKey, readConfig, sealOption } from "./config.js";
import { createOrder, problem } from "./orders.js";

/** The package's shard, sealing its records with the keys of the secret `IDEM_SEAL_KEYS`
 * when it is set (IDEM-SEAL-1). Keys that do not parse stop the object: nothing is written
 * in clear that was meant to be sealed. */
export class IdempotencyShard extends Shard {
  constructor(state, env) {
    super(state, env, { seal: sealOption(env) });
  }
}

const LEDGER_NAME = "orders";

/**
 * The orders, in one Durable Object: `POST /orders` runs here, next to them, with its
 * idempotency records in the same storage. `record` counts a run of an order handler and
 * returns its number (the other routes call it); `count` is what `GET /count` answers. The
 * run count is the tests' oracle for how often a handler ran, not an effect of an order: it
 * is written apart from the order, so that it counts runs whose order never commits.
 */
export class OrderLedger extends DurableObject {
  #count = 0;
  #store;
  /** The settings and the protected order handler, per set of settings. */
  #orders = new Map();

  constructor(state, env) {
    super(state, env);
    // Settings the worker refuses never reach the object: it answers 500 misconfigured.
    let writesOnly = true;
    try {
      writesOnly = readConfig(env).writesOnly;
    } catch {}
    this.#store = new DurableObjectLocalStore(state, { writesOnly, seal: sealOption(env) });
    state.blockConcurrencyWhile(async () => {
      this.#count = (await state.storage.get("count")) ?? 0;
    });
  }

  /** Counts one run of an order handler; resolves once it is stored. */
  async record() {
    this.#count += 1;
    const n = this.#count;
    await this.ctx.storage.put("count", n);
    return n;
  }

  /** The number of runs stored so far, and of orders committed. */
  async count() {
    return { count: this.#count, orders: (await this.ctx.storage.get("orders")) ?? 0 };
  }

  /** `POST /orders`, forwarded by the worker once it has checked the route, the method, the
   * account and the settings; or `POST /unprotected/orders`, the same handler without
   * idempotency, its order written at once. */
  async fetch(request) {
    const env = this.env;
    const key = configKey(env);
    let setup = this.#orders.get(key);
    if (setup === undefined) {
      const config = readConfig(env);
      const store = this.#store;
      const orders = withIdempotency(
        (request) =>
          createOrder(request, config.orderDelayMs, () => this.record(), {
            store,
            // The object dies once what it wrote so far is durable (the run, and the
            // claim unless it is held in memory): in-memory state gone, every request it
            // runs fails. A written claim stays until its lease ends; a held one is gone.
            crash: async () => {
              await this.ctx.storage.sync();
              this.ctx.abort("the order handler crashed");
            },
          }),
        idempotencyOptions(config, store),
      );
      setup = { config, orders };
      if (this.#orders.size >= 4) this.#orders.clear();
      this.#orders.set(key, setup);
    }
    if (new URL(request.url).pathname === "/unprotected/orders") {
      return createOrder(request, setup.config.orderDelayMs, () => this.record(), { storage: this.ctx.storage });
    }
    return setup.orders(request);
  }

  /** Expires the idempotency records that are due. */
  alarm() {
    return this.#store.alarm();
  }
}

function ledger(env) {
  return env.LEDGER.get(env.LEDGER.idFromName(LEDGER_NAME));
}

/**
 * The account a request comes from: this API's callers authenticate with a long-lived API
 * key (`Authorization: Bearer <key>`), one per account, so the key names the account. An
 * API with OAuth access tokens, which rotate, would look the token up and return the user
 * id instead: idempotency keys must stay with the caller across a token refresh.
 */
function accountOf(request) {
  const auth = request.headers.get("authorization") ?? "";
  return auth.startsWith("Bearer ") && auth.length > 7 ? `key:${auth.slice(7).trim()}` : null;
}

/** The idempotency options of every protected route, on `store`. */
function idempotencyOptions(config, store) {
  const { logEvents } = config;
  return {
    ...config.idempotency,
    store,
    // Requests without an account never get here (401 below).
    principal: accountOf,
    onEvent:
      logEvents === "off"
        ? undefined
        : (event) => {
            if (event.securityRelevant) console.warn("idempotency", event.name, event.key ?? "");
            else if (event.error !== undefined) console.error("idempotency", event.name, event.key ?? "", event.error);
            else if (logEvents === "all") console.log("idempotency", event.name, event.key ?? "");
          },
  };
}

/** What one environment (one set of settings and bindings) needs, built on its first
 * request and kept for the next ones. Never at module load: the bindings arrive with the
 * request, and Workers refuse to generate random values outside a request handler. */
const prepared = new Map();

function prepare(env) {
  const key = configKey(env);
  let entry = prepared.get(key);
  if (entry !== undefined && entry.idem === env.IDEM) return entry;
  let config;
  let handler;
  entry = {};
  try {
    config = readConfig(env);
    const options = idempotencyOptions(config, new DurableObjectStore(env.IDEM));
    handler = (request, env) => createOrder(request, config.orderDelayMs, () => ledger(env).record());
    // Webhook events are remembered as long as keys: longer than any provider retries. Its
    // engine is built first: it checks the retentions and the lease every route shares, so
    // that an error of theirs is not taken for one of a kind's bounds below.
    const inbox = new Inbox({
      store: options.store,
      responseTtl: config.idempotency.responseTtl,
      keyTtl: config.idempotency.keyTtl,
      lease: config.idempotency.lease,
    });
    // The other key kinds: the same handler and store, each route with its own kind. Their
    // records live in scopes of their own, so the shards keep them apart. The engine checks
    // each kind's bounds against the key retention: a bound that does not fit is refused with
    // the engine's own error, named by the settings it comes from.
    const kind = (variables, extra) => {
      try {
        return new Idempotency({ ...options, keyKind: undefined, ...extra });
      } catch (err) {
        if (/^IDEM-/.test(err?.code ?? "")) throw new ConfigError(variables, err.message);
        throw err;
      }
    };
    const payments = kind("IDEM_TIME_MAX_AHEAD_MS, IDEM_TIME_MAX_AGE_MS", { keyKind: "unix-time", timeKeys: config.kinds.timeKeys });
    const transfers = kind("IDEM_COUNTER_BITS, IDEM_COUNTER_WINDOW", { keyKind: "counter", counter: config.kinds.counter });
    const checkout = config.kinds.token === null ? null : kind("IDEM_TOKEN_TTL_MS", { keyKind: "token", token: config.kinds.token });
    entry = {
      payments: withIdempotency(handler, payments),
      transfers: withIdempotency(handler, transfers),
      sessions: transfers,
      checkout: checkout === null ? null : withIdempotency(handler, checkout),
      tokens: checkout,
      inbox,
    };
  } catch (err) {
    if (!(err instanceof ConfigError || /^IDEM-/.test(err?.code ?? ""))) throw err;
    entry = { idem: env.IDEM, error: err.message };
    prepared.set(key, entry);
    return entry;
  }
  if (prepared.size >= 4) prepared.clear();
  entry = { ...entry, idem: env.IDEM, config, handler };
  prepared.set(key, entry);
  return entry;
}

/**
 * `POST /webhooks/payments`: a payment provider's event (`{"id": "evt_…", …}`). The first
 * delivery of an event id is processed (one ledger entry), a redelivery is acknowledged
 * without processing, also days later; while another delivery of it is processed, this one
 * is refused with 409 and `Retry-After`, so that the provider sends it again. The answer is
 * the inbox's receipt. A real receiver verifies the provider's signature before this.
 */
async function receiveEvent(request, env, inbox) {
  const body = await request.text();
  let event;
  try {
    event = JSON.parse(body);
  } catch {
    event = null;
  }
  if (event === null || typeof event !== "object" || typeof event.id !== "string" || event.id === "") {
    return problem(400, "invalid-event", "The event is not valid", 'send a JSON event with a string "id"');
  }
  const delivery = await inbox.receive({ source: "payments", id: event.id, body, contentType: "application/json" }, async () => {
    await ledger(env).record();
  });
  return delivery.response;
}

export default {
  async fetch(request, env, ctx) {
    try {
      return await route(request, env, ctx);
    } catch (err) {
      // When the order handler threw, withIdempotency has recorded the unknown outcome
      // before the error got here: the retry with the same key takes over as recovered.
      console.error("request failed", err);
      return plainProblem(500, "an internal error stopped the request; retry with the same key");
    }
  },
};

/** The routes that answer an operation of their own, never a status query. */
const OPERATIONS = new Set(["/sessions", "/idempotency-tokens"]);

/** Dispatches a request to its route. */
async function route(request, env, ctx) {
  const { pathname } = new URL(request.url);
  if (pathname === "/count") {
    // The oracle needs no settings: it answers even when they are wrong.
    if (request.method !== "GET") return methodNotAllowed("GET");
    return Response.json(await ledger(env).count(), { headers: { "cache-control": "no-store" } });
  }
  const setup = prepare(env);
  if (setup.error !== undefined) {
    return problem(500, "misconfigured", "The worker is misconfigured", setup.error);
  }
  const guarded = {
    "/orders": true,
    "/payments": setup.payments,
    "/transfers": setup.transfers,
    "/checkout": setup.checkout,
    "/sessions": true,
    "/idempotency-tokens": setup.tokens,
  };
  if (pathname in guarded) {
    // A GET with Idempotency-Status on a guarded route is a status query about one of its
    // requests, answered by withIdempotency from that route's store.
    const asking = request.method === "GET" && !OPERATIONS.has(pathname) && request.headers.has(statusHeader());
    if (request.method !== "POST" && !asking) return methodNotAllowed("POST");
    if (accountOf(request) === null) {
      return problem(401, "unauthenticated", "An API key is required", "send Authorization: Bearer <api key>", {
        "www-authenticate": "Bearer",
      });
    }
    if (guarded[pathname] === null) {
      return problem(500, "misconfigured", "Tokens are not configured", "set IDEM_TOKEN_SECRET (64 hex digits)");
    }
  }
  switch (pathname) {
    case "/webhooks/payments":
      if (request.method !== "POST") return methodNotAllowed("POST");
      return receiveEvent(request, env, setup.inbox);
    case "/orders":
      // Claimed, run and completed in the object that holds the orders.
      return ledger(env).fetch(request);
    case "/payments":
      return setup.payments(request, env, ctx);
    case "/transfers":
      return setup.transfers(request, env, ctx);
    case "/checkout":
      return setup.checkout(request, env, ctx);
    case "/sessions":
      return setup.sessions.sessionResponse(request, { route: "/transfers" });
    case "/idempotency-tokens":
      return setup.tokens.tokenResponse(request, { route: "/checkout" });
    case "/unprotected/orders":
      if (!setup.config.unprotectedRoute) break;
      if (request.method !== "POST") return methodNotAllowed("POST");
      return ledger(env).fetch(request);
    case "/unprotected/runs":
      if (!setup.config.unprotectedRoute) break;
      if (request.method !== "POST") return methodNotAllowed("POST");
      return setup.handler(request, env);
    default:
      break;
  }
  return plainProblem(404, `no route for ${pathname}`);
}
