// Telemetry through the built package and `idem/opentelemetry`, into OpenTelemetry's
// in-memory exporters: one span per operation with the record's digest, its decision and its
// outcome; the metrics under idem-core's names; never the key or the principal in clear
// (IDEM-EVT-2). The names come from the module (`telemetryNames`), as the Rust layer's come
// from idem-core.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Idempotency, Inbox, MemoryStore, withIdempotency } from "idem";
import { openTelemetry } from "idem/opentelemetry";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { AggregationTemporality, InMemoryMetricExporter, MeterProvider, PeriodicExportingMetricReader } from "@opentelemetry/sdk-metrics";
import { deferred, manualClock } from "./helpers.mjs";

const PRINCIPAL = "user-principal-5b2e";

/** Providers with in-memory exporters, and the hook on them. */
function otel() {
  const spans = new InMemorySpanExporter();
  const tracer = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] }).getTracer("test");
  const metrics = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
  const reader = new PeriodicExportingMetricReader({ exporter: metrics, exportIntervalMillis: 3_600_000 });
  const meter = new MeterProvider({ readers: [reader] }).getMeter("test");
  return {
    telemetry: openTelemetry({ tracer, meter }),
    /** The spans ended since the last call. */
    take() {
      const out = spans.getFinishedSpans();
      spans.reset();
      return out;
    },
    /** The metric `name`'s points: `[value (a sum's, a histogram's count), attributes]`. */
    async points(name) {
      await reader.forceFlush();
      const last = metrics.getMetrics().at(-1);
      const out = [];
      for (const scope of last?.scopeMetrics ?? []) {
        for (const m of scope.metrics.filter((m) => m.descriptor.name === name)) {
          for (const p of m.dataPoints) out.push([typeof p.value === "number" ? p.value : p.value.count, p.attributes, m.descriptor]);
        }
      }
      return out;
    },
    async total(name, key, value) {
      return (await this.points(name)).filter(([, a]) => key === undefined || a[key] === value).reduce((n, [v]) => n + v, 0);
    },
  };
}

const post = (key, body = "{}") =>
  new Request("http://127.0.0.1/orders", {
    method: "POST",
    headers: { "idempotency-key": `"${key}"`, "content-type": "application/json", "x-user": PRINCIPAL },
    body,
  });

/** The one span named `name`. */
function one(spans, name) {
  const found = spans.filter((s) => s.name === name);
  assert.equal(found.length, 1, `spans named ${name}: ${spans.map((s) => s.name)}`);
  return found[0];
}

/** Every attribute value of every span, as text. */
const values = (spans) => spans.flatMap((s) => [...Object.values(s.attributes), ...s.events.flatMap((e) => [e.name, ...Object.values(e.attributes ?? {})])]).map(String);

test("a guarded request: one span per request, executed, replayed, mismatch, conflict; never the key (IDEM-EVT-2)", async () => {
  const o = otel();
  const gate = deferred();
  let runs = 0;
  const handler = withIdempotency(
    async (request) => {
      runs++;
      if (new URL(request.url).searchParams.has("slow")) await gate.promise;
      return new Response("created", { status: 201 });
    },
    // The host names its routes: the route is the span's http.route.
    { store: new MemoryStore(), principal: (r) => r.headers.get("x-user"), route: () => "/orders", telemetry: o.telemetry },
  );
  const key = "order-key-91f0c2";

  assert.equal((await handler(post(key))).status, 201);
  const fresh = one(o.take(), "idem.request");
  console.log("exported span:", fresh.name, JSON.stringify(fresh.attributes));
  assert.equal(fresh.attributes["idem.outcome"], "executed");
  assert.equal(fresh.attributes["idem.decision"], "executed");
  assert.equal(fresh.attributes["idem.operation"], "request");
  assert.equal(fresh.attributes["http.request.method"], "POST");
  assert.equal(fresh.attributes["http.route"], "/orders");
  assert.equal(fresh.attributes["http.response.status_code"], 201);
  assert.equal(fresh.attributes["error.type"], undefined);
  const digest = fresh.attributes["idem.key.digest"];
  assert.match(digest, /^[0-9a-f]{32}$/);
  let seen = [fresh];

  const retry = await handler(post(key));
  assert.equal(retry.headers.get("idempotent-replayed"), "true");
  const replay = one(o.take(), "idem.request");
  assert.equal(replay.attributes["idem.outcome"], "replayed");
  assert.equal(replay.attributes["idem.key.digest"], digest, "one key, one digest");

  assert.equal((await handler(post(key, '{"n":2}'))).status, 422);
  const mismatch = one(o.take(), "idem.request");
  assert.equal(mismatch.attributes["idem.outcome"], "mismatch");
  assert.equal(mismatch.attributes["error.type"], "key-reuse-mismatch");
  assert.equal(mismatch.attributes["http.response.status_code"], 422);
  seen.push(replay, mismatch);

  // A duplicate racing a request in flight.
  const slow = (k) => new Request(`http://127.0.0.1/orders?slow`, { method: "POST", headers: post(k).headers, body: "{}" });
  const first = handler(slow("race-key-7d"));
  await new Promise((resolve) => setTimeout(resolve, 10));
  assert.equal((await handler(slow("race-key-7d"))).status, 409);
  gate.resolve();
  assert.equal((await first).status, 201);
  const raced = o.take();
  assert.deepEqual(raced.map((s) => s.attributes["idem.outcome"]).sort(), ["conflict", "executed"]);
  assert.equal(raced.find((s) => s.attributes["idem.outcome"] === "conflict").attributes["error.type"], "in-progress");
  seen.push(...raced);
  assert.equal(runs, 2);

  assert.equal(await o.total("idem.requests", "idem.outcome", "executed"), 2);
  assert.equal(await o.total("idem.requests", "idem.outcome", "replayed"), 1);
  assert.equal(await o.total("idem.requests", "idem.outcome", "mismatch"), 1);
  assert.equal(await o.total("idem.requests", "idem.outcome", "conflict"), 1);
  for (const secret of [key, "race-key-7d", PRINCIPAL]) {
    assert.ok(!values(seen).some((v) => v.includes(secret)), `${secret} in ${values(seen)}`);
  }
});

test("a lease taken over is counted and its request recovered; store calls are timed, writes counted", async () => {
  const o = otel();
  const clock = manualClock();
  const memory = new MemoryStore();
  // A store outside the module (as Redis, Postgres or a Durable Object are): its calls cross
  // to JavaScript, where they are timed.
  const store = { load: (key) => memory.load(key), apply: (key, write, now) => memory.apply(key, write, now) };
  const first = deferred();
  let runs = 0;
  const handler = withIdempotency(
    async () => {
      if (++runs === 1) await first.promise;
      return new Response(`run ${runs}`, { status: 201 });
    },
    { store, principal: "none", lease: 1000, now: clock, telemetry: o.telemetry },
  );
  const zombie = handler(post("lease-key"));
  await new Promise((resolve) => setTimeout(resolve, 10));
  clock.advance(1001);
  assert.equal(await (await handler(post("lease-key"))).text(), "run 2");
  first.resolve();
  await zombie;
  assert.equal(await o.total("idem.lease.takeovers"), 1);
  const recovered = o.take().find((s) => s.attributes["idem.outcome"] === "recovered");
  assert.ok(recovered, "a recovered span");
  assert.equal(recovered.attributes["idem.decision"], "took-over");

  const loads = await o.points("idem.store.duration");
  const load = loads.find(([, a]) => a["idem.store.operation"] === "load");
  const apply = loads.find(([, a]) => a["idem.store.operation"] === "apply");
  assert.ok(load[0] >= 2 && apply[0] >= 3, JSON.stringify(loads));
  assert.equal(load[2].unit, "s");
  // Two claims (the zombie's, the takeover's) and the takeover's completion; the zombie's
  // completion is fenced out and writes nothing.
  assert.equal(await o.total("idem.records.written"), 3);
});

test("a status query and inbox deliveries have spans of their own", async () => {
  const o = otel();
  const store = new MemoryStore();
  const idem = new Idempotency({ store, principal: "none", telemetry: o.telemetry });
  await idem.handle({ method: "POST", target: "/orders", key: '"status-key"', body: new Uint8Array() }, async () => ({ status: 201 }));
  const [guarded] = o.take();
  const answer = await idem.status({ target: "/orders", key: '"status-key"', status: "POST" });
  assert.equal(answer.status, 200);
  const status = one(o.take(), "idem.status");
  assert.equal(status.attributes["idem.outcome"], "executed");
  assert.equal(status.attributes["idem.key.digest"], guarded.attributes["idem.key.digest"]);
  // No route function: a raw path may carry ids, so it is no span's http.route.
  assert.equal(status.attributes["http.route"], undefined);

  const inbox = new Inbox({ store, telemetry: o.telemetry });
  const delivery = { source: "psp", id: "evt_1", body: "{}" };
  await inbox.receive(delivery, () => {});
  await inbox.receive(delivery, () => {});
  const deliveries = o.take();
  assert.deepEqual(
    deliveries.map((s) => [s.name, s.attributes["idem.outcome"], s.attributes["idem.decision"]]),
    [
      ["idem.inbox.delivery", "executed", "executed"],
      ["idem.inbox.delivery", "replayed", "replayed"],
    ],
  );
  assert.equal(await o.total("idem.requests", "idem.operation", "inbox.delivery"), 2);
});

test("a hook that is not one is refused; one that throws changes no answer", async () => {
  assert.throws(() => new Idempotency({ store: new MemoryStore(), principal: "none", telemetry: {} }), { code: "IDEM-JS-1" });
  const broken = { startSpan: () => ({ setAttribute() { throw new Error("x"); }, end() { throw new Error("x"); } }), count() { throw new Error("x"); }, record() {} };
  const handler = withIdempotency(async () => new Response("ok", { status: 201 }), { store: new MemoryStore(), principal: "none", telemetry: broken });
  assert.equal((await handler(post("broken-hook"))).status, 201);
  assert.equal((await handler(post("broken-hook"))).headers.get("idempotent-replayed"), "true");
});
