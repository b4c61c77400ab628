// Compiled by `npm run typecheck` against the hand-written index.d.ts: every public shape is
// used the way the README shows, so a type that drifts from the code fails here.
import {
  DurableObjectLocalStore,
  DurableObjectStore,
  Idempotency,
  Inbox,
  IdempotencyShard,
  MemoryStore,
  StoreFullError,
  idempotencyOf,
  keyHeader,
  lowWaterHeader,
  methodNotAllowed,
  plainProblem,
  statusHeader,
  statusMediaType,
  withIdempotency,
  type IdempotencyEvent,
  type IdempotencyStore,
  type PlainReply,
  type StoreWrite,
} from "./index.js";
import { idempotentFetch, reconcile, type IdempotentFetchResult } from "./client.js";
import initClient, * as clientManual from "./client-manual.js";
import initAsync, * as manual from "./manual.js";

const store = new MemoryStore({ maxEntries: 10, maxBytes: 1 << 20 });
const held: number = store.bytes + store.size;
const sealed = new MemoryStore({ seal: { keys: [{ id: "2026-11", key: new Uint8Array(32) }] } });
const rotated: boolean = sealed.replaceSeal({ keys: [{ id: "2027-05", key: new Uint8Array(32) }, { id: "2026-11", key: new Uint8Array(32) }] });
const inspected: Uint8Array | undefined = sealed.stored("k");
const events: IdempotencyEvent[] = [];
const handler = withIdempotency(
  async (request: Request, env: { DB: string }) => {
    const ctx = idempotencyOf(request);
    if (ctx?.recovered) await ctx.extend();
    return new Response(env.DB, { status: 201 });
  },
  {
    store,
    keys: "required",
    keyKind: "uuid-v7",
    responseTtl: 86_400_000,
    keyTtl: 7 * 86_400_000,
    lease: 60_000,
    unknownOutcome: "reexecute",
    inFlight: { wait: 5_000, poll: 25 },
    fingerprint: { headers: ["x-api-version"], exclude: ["/sentAt"], json: "auto", maxBody: 1 << 20 },
    principal: (r) => r.headers.get("x-account-id") ?? "",
    route: (_r, url) => url.pathname,
    methods: ["POST"],
    onEvent: (e) => events.push(e),
  },
);
const answered: Promise<Response> = handler(new Request("https://x/orders", { method: "POST" }), { DB: "db" });
void answered;

const custom: IdempotencyStore = {
  load: async (_key: string) => null,
  apply: async (_key: string, write: StoreWrite, _now: number) => write.expect === null && !write.inFlight,
};
const plain = new Idempotency<{ method: string; target: string; key: string; account: string }>({
  store: custom,
  principal: (input) => input.account,
});
void plain.handle({ method: "POST", target: "/pay", key: '"k"', account: "acct_1" }, () => ({ status: 200, body: "ok" })).then((r) => {
  const replayed: boolean = r.replayed;
  const body: Uint8Array = r.body;
  return [replayed, body];
});

// An adapter of its own, through the methods the package's adapters call.
const adapter = new Idempotency<Request>({ store, principal: "none" });
const guard = async (request: Request): Promise<Response | undefined> => {
  const headers = request.headers;
  const field: string | null = adapter.statusQueries ? headers.get(adapter.statusHeader) : null;
  if (field !== null) return adapter.serve(adapter.statusSlot(headers.get(adapter.keyHeader), undefined, "/orders", field, headers), (reply) => adapter.responseOf(reply));
  const key: string | null = headers.get(adapter.keyHeader);
  if (!adapter.protects(request.method, key !== null)) return undefined;
  const unread: boolean = !adapter.readsBody(request.method, key !== null);
  void unread;
  const answer = (reply: PlainReply): Response => adapter.mappedRefusal(reply) ?? adapter.responseOf(reply);
  const tooLarge: number | undefined = adapter.refuseBody(Number(headers.get("content-length") ?? 0));
  if (tooLarge !== undefined) return adapter.serve(tooLarge, answer);
  const principal: string | undefined = await adapter.principalOf(request);
  const lowWater: string | null = headers.get(adapter.lowWaterHeader);
  const slot: number = adapter.begin(key, principal, request.method, adapter.route ? "/orders" : "/", "/orders", headers.get("content-type"), headers, new Uint8Array(), lowWater);
  return adapter.serve(slot, answer, async (context) => new Response(context.key));
};
void guard;
void adapter
  .deliver({ source: "stripe", id: "evt_2", body: new Uint8Array() }, ({ recovered, fence }) => void [recovered, fence])
  .then((d) => d.acknowledge);
void plain.handle({ method: "POST", target: "/pay", key: '"k2"', account: "acct_2" }, () => ({ status: 204 })).then((reply: PlainReply) => reply.executed);
// An answer longer than the store keeps, which the caller sends on itself (IDEM-STORE-5).
const limit: number = plain.maxResponseBytes;
void plain.handle({ method: "POST", target: "/export", key: '"k3"', account: "acct_3" }, () => ({ status: 200, passThrough: limit > 0 })).then((reply: PlainReply) => reply.passThrough === true);
void plain.status({ method: "GET", target: "/pay", key: '"k2"', status: "POST; settle", account: "acct_2" }).then((reply: PlainReply) => reply.status);

declare const namespace: { idFromName(name: string): unknown; get(id: unknown): { fetch(input: string, init?: RequestInit): Promise<Response> } };
const doStore = new DurableObjectStore(namespace);
const kept: number = doStore.maxResponseBytes;
void kept;
void withIdempotency(() => new Response("ok"), { store: doStore, principal: "none" });
declare const state: ConstructorParameters<typeof IdempotencyShard>[0];
const shard = new IdempotencyShard(state);
void shard.alarm();
const local = new DurableObjectLocalStore(state, { prefix: "idem:", writesOnly: true });
void local.setAlarm(Date.now() + 60_000).then(() => local.getAlarm()).then((at: number | null) => at);
void local.alarm().then((own: boolean) => (own ? "the object's own alarm work" : "records expired"));
void withIdempotency(
  (request) =>
    local.transaction(idempotencyOf(request)!, async (tx) => {
      tx.put("orders", ((await tx.get("orders")) as number | undefined ?? 0) + 1);
      const context = idempotencyOf(request)!;
      const bytes: Response = context.respond(new Uint8Array([1]), { status: 200 });
      void bytes;
      return context.json({ id: "ord_1" }, { status: 201, headers: { location: "/orders/ord_1" } });
    }),
  { store: local, principal: "none" },
);
void local.alarm();
const routing: Response[] = [plainProblem(404, "no route for /refunds"), methodNotAllowed("POST")];
void routing;
// @ts-expect-error
void plainProblem(418, "a teapot has no about:blank problem of the core's");
const full: string = new StoreFullError().code;
void full;

const saved = new Map<string, Uint8Array>();
void (async () => {
  const result = await idempotentFetch(
    "https://api.example/orders",
    { method: "POST", body: "{}", headers: { "content-type": "application/json" }, credentials: "include", signal: AbortSignal.timeout(10_000) },
    {
      keyVersion: 7,
      retry: { base: 100, cap: 5_000, maxAttempts: 5, deadline: 60_000 },
      id: "order-42",
      persist: { load: (id) => saved.get(id), save: (id, b) => void saved.set(id, b), delete: (id) => void saved.delete(id) },
    },
  );
  // The signal is init's, as for fetch.
  // @ts-expect-error
  await idempotentFetch("https://api.example/orders", { method: "POST" }, { signal: AbortSignal.timeout(10_000) });
  if (result.outcome === "completed") {
    const status: number = result.status;
    void status;
  } else if (result.outcome === "undetermined") {
    const reason: string | undefined = result.reason;
    void reason;
  }
})();

// The key kinds with state of their own: tokens and counter sessions through one Idempotency.
const tokens = new Idempotency<Request>({
  store,
  principal: (r) => r.headers.get("x-account-id") ?? "",
  keyKind: "token",
  token: { secret: "ab".repeat(32), ttl: 3_600_000 },
});
void withIdempotency(() => new Response("paid", { status: 201 }), tokens);
void (async () => {
  const request = new Request("https://x/idempotency-tokens", { method: "POST" });
  const issued: { token: string; expires: number } = await tokens.issueToken(request, { route: "/checkout" });
  const endpoint: Response = await tokens.tokenResponse(request, { route: "/checkout", method: "POST" });
  void [issued, endpoint];
})();
const counters = new Idempotency({ store, principal: "none", keyKind: "counter", counter: { bits: 16, window: 8 } });
void counters.openSession({ method: "POST", target: "/sessions", key: null }, { route: "/transfers", client: "app-1", firstSeq: 0n }).then((s) => {
  const epoch: string = s.epoch;
  return epoch;
});
void new Idempotency({ store, principal: "none", keyKind: "unix-time", timeKeys: { maxAhead: 60_000, maxAge: 86_400_000 } });
void counters.handle({ method: "POST", target: "/transfers", key: "app-1:5:0", lowWater: "0" }, () => ({ status: 201 }));

const inbox = new Inbox({ store, keyTtl: 7 * 86_400_000 });
void inbox.receive({ source: "stripe", id: "evt_1", body: "{}" }, async ({ recovered }) => void recovered).then((d) => {
  const ack: boolean = d.acknowledge;
  return d.outcome === "in-progress" ? d.retryAfter : ack;
});
void new Idempotency({ store, principal: "none", keyFallback: "derive", fingerprint: { exclude: ["/sentAt"] } });
void new Idempotency({ store, principal: "none", keyFallback: { jsonPointer: "/meta/idempotencyKey" } });

// The stores and adapters beside the main entry, with the real client and framework types.
import { RedisStore } from "idem/redis";
import { PostgresStore } from "idem/postgres";
import { storeTests } from "idem/store-tests";
import { idempotency as honoIdempotency } from "idem/hono";
import { idempotency as expressIdempotency } from "idem/express";
import { Redis } from "ioredis";
import pg from "pg";
import { Hono } from "hono";
import express from "express";
import { idempotency as fastifyIdempotency } from "idem/fastify";
import Fastify from "fastify";
import { IDEMPOTENCY, Idempotent, IdempotencyModule, type IdempotentRequest } from "idem/nestjs";
import { Controller, Inject, Module, Post, Req } from "@nestjs/common";

const redisStore = new RedisStore(new Redis("redis://127.0.0.1:6379", { lazyConnect: true }), { prefix: "app:" });
const pool = new pg.Pool();
const pgStore = new PostgresStore<pg.PoolClient>(pool);
const migration: string = PostgresStore.schema;
void [redisStore, migration];
void pgStore.sweep(Date.now(), 100).then((n: number) => n);
const guarded = withIdempotency(async (request) => {
  const context = idempotencyOf(request);
  if (context === undefined) return new Response(null, { status: 400 });
  return pgStore.transaction(context, async (client) => {
    await client.query("INSERT INTO orders (amount) VALUES ($1)", [1]);
    return new Response("created", { status: 201 });
  });
}, { store: pgStore, principal: "none", keyHeader: "X-Request-Key" });
void guarded;
storeTests((name: string, fn: () => Promise<void>) => void [name, fn], { name: "redis", open: () => redisStore, selfExpiring: true });

const hono = new Hono<{ Variables: { user: string } }>();
hono.use("/api/*", honoIdempotency({ store: redisStore, principal: (c: { get(name: "user"): string }) => c.get("user"), skip: () => false }));
const app = express();
app.use(
  "/api",
  expressIdempotency({
    store: pgStore,
    principal: (req: express.Request) => req.get("x-user") ?? "",
    problem: (problem) => Response.json({ error: problem.type }, { status: problem.status }),
  }),
);
app.post("/api/orders", (req, res) => {
  res.json({ key: req.idempotency?.key, bytes: req.rawBody?.byteLength });
});
const fastify = Fastify();
void fastify.register(fastifyIdempotency, {
  store: redisStore,
  principal: (request) => String(request.headers["x-user"] ?? ""),
  skip: (request) => request.url === "/health",
  fingerprint: { maxBody: 1 << 16 },
});
fastify.post("/orders", { config: { idempotency: true } }, async (request) => ({
  key: request.idempotency?.key,
  bytes: request.rawBody?.byteLength,
}));
const nestOptions = IdempotencyModule.forRoot<{ user?: { id: string } }>({ store: pgStore, principal: (req) => req.user?.id ?? "", keys: "required" });
const nestDefault = IdempotencyModule.forRoot({ store, responseTtl: 86_400_000 });
void [nestOptions, nestDefault];
class NestOrders {
  constructor(readonly idempotency: Idempotency) {}
  create(req: IdempotentRequest) {
    return { key: req.idempotency?.key, bytes: req.rawBody?.byteLength };
  }
}
Controller("orders")(NestOrders);
Idempotent()(NestOrders);
Inject(IDEMPOTENCY)(NestOrders, undefined, 0);
Reflect.decorate([Post(), Idempotent()], NestOrders.prototype, "create", Object.getOwnPropertyDescriptor(NestOrders.prototype, "create"));
Req()(NestOrders.prototype, "create", 0);
Module({ imports: [nestDefault], controllers: [NestOrders] })(class NestApp {});

// idem/manual: the same API, with the host's own initialisation.
void (async () => {
  const compiled: WebAssembly.Module = await WebAssembly.compile(new Uint8Array(8));
  manual.initSync({ module: compiled });
  manual.initSync({ module: new Uint8Array(8) });
  await initAsync();
  await initAsync({ module_or_path: new URL("https://example.com/idem_wasm_bg.wasm") });
  await initAsync({ module_or_path: fetch("https://example.com/idem_wasm_bg.wasm") });
  const sameStore: MemoryStore = new manual.MemoryStore();
  void manual.withIdempotency(() => new Response(null, { status: 204 }), { store: sameStore, principal: "none" });
})();

// idem/client/manual: the client's API, with the host's own initialisation.
void (async () => {
  clientManual.initSync({ module: await WebAssembly.compile(new Uint8Array(8)) });
  await initClient({ module_or_path: new URL("https://example.com/idem_client_bg.wasm") });
  const sent: IdempotentFetchResult = await clientManual.idempotentFetch("https://api.example/orders", { method: "POST" });
  void sent;
})();

// The names idem's requests and answers use, for a CORS list.
const allowHeaders: string = [keyHeader(), lowWaterHeader(), statusHeader()].join(", ");
const statusType: string = statusMediaType();
void [allowHeaders, statusType];
// A request whose payload is gone, asked about after a restart.
declare const pending: { load(id: string): Uint8Array | null; save(id: string, b: Uint8Array): void; delete(id: string): void };
void reconcile("https://api.example/orders", { method: "POST" }, { id: "order-1", persist: pending }).then((r) => {
  if (r === null) return "nothing pending";
  const outcome: IdempotentFetchResult["outcome"] = r.outcome;
  return outcome === "executed" || outcome === "not-executed" ? outcome : r.key;
});

// idem/opentelemetry
import { openTelemetry } from "idem/opentelemetry";
const traced = new Idempotency({ store: new MemoryStore(), principal: "none", telemetry: openTelemetry() });
void traced;
