// `idem/fastify` on Fastify 5 over loopback HTTP (IDEM-JS-4): the adapters' shared checks
// (test/framework-http.mjs), the store kit's shared-store case on one Redis through two
// Fastify apps, what only Fastify has (route opt-in, the parsed body, hooks' headers, errors
// to Fastify's error handling), and the example of docs/frameworks/fastify.md run as written.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { request as httpRequest } from "node:http";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { Readable } from "node:stream";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import Fastify from "fastify";
import Redis from "ioredis";
import { MemoryStore } from "idem";
import { idempotency } from "idem/fastify";
import { RedisStore } from "idem/redis";
import { MAX_BODY, ORDER, adapterChecks, checkEndlessAnswer, endlessSource, fresh, post, sharedStoreCheck } from "./framework-http.mjs";
import { startRedis } from "./servers.mjs";
import { manualClock } from "./helpers.mjs";

const here = dirname(fileURLToPath(import.meta.url));

/** The app of the shared checks on Fastify, with `options` for the plugin. */
async function startApp({ store = new MemoryStore(), ...options } = {}) {
  const state = { count: 0, errors: [] };
  const app = Fastify();
  app.addHook("onRequest", async (request, reply) => {
    reply.header("access-control-allow-origin", "*");
  });
  await app.register(idempotency, {
    store,
    principal: (request) => request.headers["x-user"] ?? "",
    fingerprint: { maxBody: MAX_BODY },
    ...options,
  });
  const guarded = { config: { idempotency: true } };
  app.post("/api/orders", guarded, async (request, reply) => {
    const id = ++state.count;
    await new Promise((resolve) => setTimeout(resolve, 40));
    const order = request.body;
    if (order === null || typeof order !== "object" || Array.isArray(order)) return reply.code(400).send({ error: "invalid order" });
    return reply.code(201).header("x-order-id", String(id)).send({ id, order, key: request.idempotency?.key, raw: request.rawBody?.byteLength });
  });
  app.get("/api/orders", async () => ({ orders: state.count }));
  app.post("/open/orders", async (request, reply) => {
    state.count++;
    return reply.code(201).send({ open: true });
  });
  app.post("/api/fails", guarded, async () => {
    state.count++;
    throw new Error("the handler failed");
  });
  app.post("/api/later", guarded, async (request, reply) => {
    // An answer sent as a stream, after the handler returned.
    state.count++;
    setTimeout(() => reply.code(202).type("text/plain").send(ReadableFrom(`accepted ${state.count}`)), 10);
    return reply;
  });
  app.post("/api/long", guarded, async (request, reply) => {
    // 5,000 bytes in 100-byte chunks, a digit each.
    state.count++;
    const chunks = Array.from({ length: 50 }, (_, i) => Buffer.alloc(100, 48 + (i % 10)));
    return reply.code(201).type("text/plain").send(Readable.from(chunks));
  });
  app.post("/api/endless", guarded, async (request, reply) => {
    reply.raw.once("close", () => (state.closed = true));
    return reply.code(200).type("application/octet-stream").send(endlessSource(state));
  });
  app.post("/api/broken", guarded, async (request, reply) => {
    // A stream that fails after its first chunk, well within the store's limit.
    state.count++;
    let started = false;
    const broken = new Readable({
      read() {
        if (started) return this.destroy(new Error("the source broke"));
        started = true;
        this.push(Buffer.from("partial "));
      },
    });
    return reply.code(200).type("text/plain").send(broken);
  });
  app.post("/api/stalls", guarded, async (request, reply) => {
    // The first run's stream says one thing and then nothing, never ending; a retry answers.
    if (++state.count > 1) return reply.code(201).type("text/plain").send("second");
    let pushed = false;
    state.stalled = new Readable({
      read() {
        if (pushed) return;
        pushed = true;
        this.push(Buffer.from("partial "));
      },
    });
    reply.trailer("x-checksum", (reply, payload, done) => done(null, "abc"));
    return reply.code(201).header("x-order-id", "1").type("text/plain").send(state.stalled);
  });
  app.post("/api/trailed", guarded, async (request, reply) => {
    state.count++;
    reply.code(201).trailer("x-checksum", (reply, payload, done) => done(null, "abc"));
    return "body";
  });
  app.post("/api/idle", guarded, async (request, reply) => {
    // 2,000 bytes at once and then nothing more, as an event stream with nothing to say.
    let pushed = false;
    state.idle = new Readable({
      read() {
        if (pushed) return;
        pushed = true;
        this.push(Buffer.alloc(2_000, "i"));
      },
    });
    return reply.code(200).type("text/event-stream").send(state.idle);
  });
  app.post("/api/redirect", guarded, async (request, reply) => {
    state.count++;
    return reply.redirect("/elsewhere", 303);
  });
  app.post("/api/fetch-response", guarded, async () => {
    state.count++;
    return new Response(`made ${state.count}`, { status: 201, headers: { "content-type": "text/plain", "x-made": "by a Response" } });
  });
  app.setErrorHandler((err, request, reply) => {
    state.errors.push(err);
    reply.code(500).send({ error: err.message, code: err.code });
  });
  const url = await app.listen({ port: 0, host: "127.0.0.1" });
  return { url, port: app.server.address().port, state, app, close: () => app.close() };
}

function ReadableFrom(text) {
  return Readable.from([Buffer.from(text)]);
}

describe("idem/fastify on Fastify 5", () => {
  let running;
  before(async () => {
    running = await startApp();
  });
  after(async () => running?.close());
  adapterChecks(() => running);

  test("the route gets its parsed body, the raw bytes and the context; hooks' headers stay on replays and refusals", async () => {
    const key = fresh();
    const first = await post(running.url, { key, body: ` ${ORDER}` });
    const answer = await first.json();
    assert.deepEqual(answer.order, JSON.parse(ORDER));
    assert.equal(answer.raw, ORDER.length + 1);
    assert.equal(answer.key, key.slice(1, -1));
    const retry = await post(running.url, { key, body: ` ${ORDER}` });
    assert.equal(retry.headers.get("idempotent-replayed"), "true");
    assert.equal(retry.headers.get("access-control-allow-origin"), "*");
    const mismatch = await post(running.url, { key, body: '{"amount":1}' });
    assert.equal(mismatch.status, 422);
    assert.equal(mismatch.headers.get("access-control-allow-origin"), "*");
  });

  test("headers the hooks set before the handler are the request's, never stored: a replay to another origin carries its own (IDEM-JS-7)", async () => {
    const app = Fastify();
    app.addHook("onRequest", async (request, reply) => {
      reply.header("access-control-allow-origin", request.headers.origin ?? "").header("x-request-id", request.headers["x-request-id"] ?? "");
    });
    await app.register(idempotency, { store: new MemoryStore(), principal: "none" });
    let runs = 0;
    app.post("/api/orders", { config: { idempotency: true } }, async (request, reply) => reply.code(201).header("x-order-id", String(++runs)).send({ id: runs }));
    const url = await app.listen({ port: 0, host: "127.0.0.1" });
    const send = (key, origin, id) =>
      fetch(`${url}/api/orders`, { method: "POST", headers: { "content-type": "application/json", "idempotency-key": key, origin, "x-request-id": id }, body: ORDER });
    try {
      const key = fresh();
      const first = await send(key, "https://a.example", "r1");
      assert.equal(first.status, 201);
      assert.equal(first.headers.get("access-control-allow-origin"), "https://a.example");
      const retry = await send(key, "https://b.example", "r2");
      assert.equal(retry.headers.get("idempotent-replayed"), "true");
      assert.equal(retry.headers.get("access-control-allow-origin"), "https://b.example");
      assert.equal(retry.headers.get("x-request-id"), "r2");
      assert.equal(retry.headers.get("x-order-id"), "1");
      assert.equal(runs, 1);
    } finally {
      await app.close();
    }
  });

  test("a handler that throws: Fastify's error handler answers, and the engine takes that 500 as an unknown outcome (IDEM-OUT-3)", async () => {
    const key = fresh();
    const before = running.state.count;
    const errors = running.state.errors.length;
    const first = await post(running.url, { key, path: "/api/fails" });
    assert.equal(first.status, 500);
    assert.deepEqual(await first.json(), { error: "the handler failed" });
    assert.equal(running.state.errors.length, errors + 1);
    // The default policy re-executes: the retry runs again, and is not a replay.
    const retry = await post(running.url, { key, path: "/api/fails" });
    assert.equal(retry.status, 500);
    assert.equal(retry.headers.get("idempotent-replayed"), null);
    assert.equal(running.state.count - before, 2);
  });

  test("an answer stream that breaks before it is whole: the engine records a throw, Fastify's error handler answers, and the retry runs again (IDEM-OUT-3)", async () => {
    const key = fresh();
    const before = running.state.count;
    const first = await post(running.url, { key, path: "/api/broken" });
    assert.equal(first.status, 500);
    assert.equal((await first.json()).error, "the source broke");
    // Not left in progress (a 409 until the lease ran out): the attempt is over.
    const retry = await post(running.url, { key, path: "/api/broken" });
    assert.equal(retry.status, 500);
    assert.equal(retry.headers.get("idempotent-replayed"), null);
    assert.equal(running.state.count - before, 2);
  });

  test("an answer stream that stalls is let go when the lease ends: the core's 500 problem, the stream destroyed, and the retry runs again (IDEM-OUT-7)", async () => {
    const short = await startApp({ lease: 1_000 });
    try {
      const key = fresh();
      const since = Date.now();
      const first = await post(short.url, { key, path: "/api/stalls" });
      assert.ok(Date.now() - since >= 1_000, "not before the lease ends");
      assert.equal(first.status, 500);
      assert.equal(first.headers.get("content-type"), "application/problem+json");
      assert.equal(first.headers.get("x-order-id"), null, "none of the app's head");
      assert.equal(first.headers.get("access-control-allow-origin"), "*", "the hooks' headers stay");
      assert.equal(first.headers.get("trailer"), null, "nor the app's trailers");
      const problem = await first.json();
      assert.equal(problem.type, "about:blank");
      assert.equal(problem.detail, "the response body was not read whole before the lease ended");
      assert.equal(short.state.stalled.destroyed, true);
      const retry = await post(short.url, { key, path: "/api/stalls" });
      assert.equal(retry.status, 201);
      assert.equal(await retry.text(), "second");
      assert.equal(short.state.count, 2);
    } finally {
      await short.close();
    }
  });

  test("an answer stream that stalls while another attempt takes the key over: its caller gets the key's outcome (IDEM-OUT-7, IDEM-LEASE-5)", async () => {
    const clock = manualClock(Date.now());
    const short = await startApp({ lease: 1_000, now: clock });
    try {
      const key = fresh();
      const first = post(short.url, { key, path: "/api/stalls" });
      while (short.state.count === 0) await new Promise((resolve) => setTimeout(resolve, 5));
      // The first attempt's lease ends on the engine's clock; a retry takes over and answers.
      clock.advance(1_500);
      const retry = await post(short.url, { key, path: "/api/stalls" });
      assert.equal(retry.status, 201);
      assert.equal(await retry.text(), "second");
      const stalled = await first;
      assert.equal(stalled.status, 201);
      assert.equal(stalled.headers.get("idempotent-replayed"), "true");
      assert.equal(await stalled.text(), "second");
      assert.equal(short.state.count, 2);
    } finally {
      await short.close();
    }
  });

  test("an answer with trailer fields goes out with them, and a retry learns it was not stored (IDEM-STORE-5)", async () => {
    const key = fresh();
    const before = running.state.count;
    const call = () =>
      new Promise((resolve, reject) => {
        const headers = { "idempotency-key": key, "content-type": "application/json", te: "trailers", "x-user": "alice" };
        const req = httpRequest({ host: "127.0.0.1", port: running.port, path: "/api/trailed", method: "POST", headers }, (res) => {
          let body = "";
          res.setEncoding("utf8");
          res.on("data", (d) => (body += d));
          res.on("end", () => resolve({ status: res.statusCode, body, trailers: res.trailers }));
        });
        req.on("error", reject);
        req.end(ORDER);
      });
    const first = await call();
    assert.equal(first.status, 201);
    assert.equal(first.body, "body");
    assert.deepEqual(first.trailers, { "x-checksum": "abc" });
    const retry = await call();
    assert.equal(retry.status, 410);
    const problem = JSON.parse(retry.body);
    assert.equal(problem.type, "urn:idem:problem:response-not-stored");
    assert.match(problem.detail, /trailer fields/);
    assert.equal(running.state.count - before, 1);
  });

  test("an answer without a body or a content type is replayed without them, as it went out (IDEM-REPLAY-4)", async () => {
    const key = fresh();
    const send = () =>
      fetch(`${running.url}/api/redirect`, { method: "POST", headers: { "content-type": "application/json", "x-user": "alice", "idempotency-key": key }, body: ORDER, redirect: "manual" });
    const first = await send();
    assert.equal(first.status, 303);
    assert.equal(first.headers.get("location"), "/elsewhere");
    assert.equal(first.headers.get("content-type"), null);
    const retry = await send();
    assert.equal(retry.status, 303);
    assert.equal(retry.headers.get("idempotent-replayed"), "true");
    assert.equal(retry.headers.get("location"), "/elsewhere");
    assert.equal(retry.headers.get("content-type"), null);
    assert.equal(await retry.text(), "");
  });

  test("a Fetch Response the handler returns is the answer: its status, headers and body are stored and replayed", async () => {
    const key = fresh();
    const first = await post(running.url, { key, path: "/api/fetch-response" });
    assert.equal(first.status, 201);
    assert.equal(first.headers.get("x-made"), "by a Response");
    const text = await first.text();
    assert.match(text, /^made \d+$/);
    const retry = await post(running.url, { key, path: "/api/fetch-response" });
    assert.equal(retry.status, 201);
    assert.equal(retry.headers.get("idempotent-replayed"), "true");
    assert.equal(retry.headers.get("x-made"), "by a Response");
    assert.equal(await retry.text(), text);
  });

  test("a stream longer than the store keeps goes out whole as it comes, and a retry learns it was not stored; one that never ends goes at the client's pace (IDEM-STORE-5)", async () => {
    const small = await startApp({ maxResponseBytes: 1_000 });
    const state = small.state;
    try {
      const key = fresh();
      const first = await post(small.url, { key, path: "/api/long" });
      assert.equal(first.status, 201);
      const body = await first.text();
      assert.equal(body.length, 5_000);
      assert.equal(body.slice(4_900), "9".repeat(100));
      const retry = await post(small.url, { key, path: "/api/long" });
      assert.equal(retry.status, 410);
      assert.equal((await retry.json()).type, "urn:idem:problem:response-not-stored");
      assert.equal(state.count, 1);
      await checkEndlessAnswer(small.port, "/api/endless", state);
      // A stream that waits for something to say is ended when the client leaves, not when
      // it next says something.
      const idle = await new Promise((resolve, reject) => {
        const headers = { "idempotency-key": fresh(), "content-type": "application/json", "x-user": "alice" };
        const req = httpRequest({ host: "127.0.0.1", port: small.port, path: "/api/idle", method: "POST", headers }, resolve);
        req.once("error", reject);
        req.end(ORDER);
      });
      assert.equal(idle.statusCode, 200);
      let got = 0;
      for await (const chunk of idle) {
        got += chunk.byteLength;
        if (got >= 2_000) break;
      }
      for (let i = 0; i < 100 && !state.idle.destroyed; i++) await new Promise((resolve) => setTimeout(resolve, 10));
      assert.equal(state.idle.destroyed, true, "the app's stream ends with the response");
    } finally {
      await small.close();
    }
  });

  test("an answer sent later as a stream is captured whole, stored and replayed", async () => {
    const key = fresh();
    const first = await post(running.url, { key, path: "/api/later" });
    assert.equal(first.status, 202);
    const text = await first.text();
    assert.match(text, /^accepted \d+$/);
    const retry = await post(running.url, { key, path: "/api/later" });
    assert.equal(retry.status, 202);
    assert.equal(retry.headers.get("idempotent-replayed"), "true");
    assert.equal(await retry.text(), text);
  });
});

describe("idem/fastify: the key header's name and the problem hook are options", () => {
  test("X-Request-Key carries the key, and refusals come in the host's own error format", async () => {
    const running = await startApp({
      keyHeader: "X-Request-Key",
      problem: (problem) => Response.json({ error: problem.type.replace("urn:idem:problem:", "") }, { status: problem.status }),
    });
    try {
      const key = fresh();
      const send = (body = ORDER) =>
        fetch(`${running.url}/api/orders`, { method: "POST", headers: { "content-type": "application/json", "x-user": "alice", "x-request-key": key }, body });
      assert.equal((await send()).status, 201);
      assert.equal((await send()).headers.get("idempotent-replayed"), "true");
      const missing = await post(running.url, { key });
      assert.equal(missing.status, 400);
      assert.deepEqual(await missing.json(), { error: "missing-key" });
      const mismatch = await send('{"amount":2}');
      assert.equal(mismatch.status, 422);
      assert.deepEqual(await mismatch.json(), { error: "key-reuse-mismatch" });
      assert.equal(running.state.count, 1);
    } finally {
      await running.close();
    }
  });

  test("a principal that throws goes to Fastify's error handler, and nothing runs", async () => {
    const running = await startApp({
      principal: () => {
        throw new Error("no session");
      },
    });
    try {
      const r = await post(running.url, { key: fresh() });
      assert.equal(r.status, 500);
      assert.deepEqual(await r.json(), { error: "no session" });
      assert.equal(running.state.count, 0);
    } finally {
      await running.close();
    }
  });
});

describe("idem/fastify: status queries about guarded routes only, after the routes' own hooks; a nested registration takes its routes over", () => {
  const STATUS = "application/vnd.idem.key-status+json";
  const ask = (url, key, field = "POST; settle", headers = {}) =>
    fetch(url, { headers: { "idempotency-key": `"${key}"`, "idempotency-status": field, "x-user": "alice", ...headers }, signal: AbortSignal.timeout(10_000) });

  test("a status query to a URL no route guards is not answered, and does not settle its key (IDEM-STATUS-2, IDEM-STATUS-4)", async () => {
    const app = Fastify();
    let runs = 0;
    await app.register(idempotency, { store: new MemoryStore(), principal: (request) => request.headers["x-user"] ?? "" });
    app.post("/orders", { config: { idempotency: true } }, async () => ({ run: ++runs }));
    app.post("/open", async () => ({ run: ++runs }));
    app.get("/health", async () => ({ ok: true }));
    await app.listen({ port: 0, host: "127.0.0.1" });
    const url = `http://127.0.0.1:${app.server.address().port}`;
    try {
      // A guarded URL without a GET route of its own: answered.
      const guarded = await ask(`${url}/orders`, fresh().slice(1, -1));
      assert.equal(guarded.status, 200);
      assert.equal(guarded.headers.get("content-type"), STATUS);
      for (const path of ["/open", "/health", "/nothing"]) {
        const r = await ask(`${url}${path}`, "k-1");
        assert.notEqual(r.headers.get("content-type"), STATUS, `${path} answered a status query`);
      }
      assert.equal((await (await fetch(`${url}/health`, { headers: { "idempotency-status": "POST" } })).json()).ok, true, "the route ran");
      const open = await fetch(`${url}/open`, { method: "POST", headers: { "idempotency-key": '"k-1"', "content-type": "application/json" }, body: "{}" });
      assert.equal(open.status, 200);
      assert.equal(runs, 1);
    } finally {
      await app.close();
    }
  });

  test("a route's own onRequest hook (its authentication) runs before a status query about it is answered (IDEM-STATUS-4)", async () => {
    const app = Fastify();
    await app.register(idempotency, { store: new MemoryStore(), principal: (request) => request.user });
    const auth = async (request, reply) => {
      if (request.headers.authorization !== "Bearer alice") return reply.code(401).send({ error: "who are you?" });
      request.user = "alice";
    };
    app.post("/orders", { config: { idempotency: true }, onRequest: auth }, async () => ({ made: true }));
    app.get("/orders", { onRequest: auth }, async () => ({ orders: [] }));
    await app.listen({ port: 0, host: "127.0.0.1" });
    const url = `http://127.0.0.1:${app.server.address().port}/orders`;
    try {
      const stranger = await ask(url, "k-2", "POST", { authorization: "Bearer mallory" });
      assert.equal(stranger.status, 401);
      const alice = await ask(url, "k-2", "POST", { authorization: "Bearer alice" });
      assert.equal(alice.status, 200);
      assert.equal(alice.headers.get("content-type"), STATUS);
    } finally {
      await app.close();
    }
  });

  test("registered again in a nested context, the plugin's own store guards that context's routes alone", async () => {
    const outer = new MemoryStore();
    const inner = new MemoryStore();
    const app = Fastify();
    await app.register(idempotency, { store: outer, principal: "none", fingerprint: { maxBody: MAX_BODY } });
    let runs = 0;
    await app.register(
      async (payments) => {
        await payments.register(idempotency, { store: inner, principal: "none", fingerprint: { maxBody: 4 * MAX_BODY } });
        payments.post("/payments", { config: { idempotency: true } }, async (request, reply) => reply.code(201).send({ run: ++runs }));
        // A status query about a nested route goes to a GET route at its URL (without one,
        // Fastify answers 404 from the outer context).
        payments.get("/payments", async () => ({ payments: runs }));
      },
      { prefix: "/v1" },
    );
    await app.listen({ port: 0, host: "127.0.0.1" });
    const base = `http://127.0.0.1:${app.server.address().port}`;
    try {
      const key = fresh();
      // Past the outer registration's limit, within the inner one's: only the inner one
      // reads it.
      const body = JSON.stringify({ pad: "p".repeat(2 * MAX_BODY) });
      const first = await post(base, { key, path: "/v1/payments", body });
      assert.equal(first.status, 201, await first.clone().text());
      const retry = await post(base, { key, path: "/v1/payments", body });
      assert.equal(retry.headers.get("idempotent-replayed"), "true");
      assert.equal(runs, 1);
      const status = await ask(`${base}/v1/payments`, key.slice(1, -1), "POST");
      assert.equal(status.headers.get("content-type"), STATUS);
      assert.equal((await status.json()).status, "completed");
      // The outer store holds nothing of the inner routes.
      assert.equal(outer.size, 0);
      assert.equal(inner.size, 1);
    } finally {
      await app.close();
    }
  });
});

describe("idem/fastify: two apps on one Redis (the store kit's shared-store case)", () => {
  let redis;
  const clients = [];
  before(async () => {
    redis = await startRedis();
  });
  after(async () => {
    for (const c of clients) c.disconnect();
    await redis?.stop();
  });
  sharedStoreCheck("Fastify on RedisStore", {
    open: () => {
      const client = new Redis(redis.url);
      clients.push(client);
      return new RedisStore(client);
    },
    start: (store) => startApp({ store }),
  });
});

describe("docs/frameworks/fastify.md: the example runs as written", () => {
  const file = join(here, "..", "examples", "frameworks", "fastify.mjs");
  const example = readFileSync(file, "utf8");

  test("the page opens with the example's text", () => {
    const page = readFileSync(join(here, "..", "..", "docs", "frameworks", "fastify.md"), "utf8");
    assert.ok(page.includes("```js\n" + example + "```"), "docs/frameworks/fastify.md must show examples/frameworks/fastify.mjs verbatim");
  });

  test("the example serves an order once and replays it", async () => {
    const child = spawn(process.execPath, [file], { env: { ...process.env, PORT: "0" }, stdio: ["ignore", "pipe", "pipe"] });
    const exited = new Promise((resolve) => child.once("exit", resolve));
    try {
      const url = await new Promise((resolve, reject) => {
        let err = "";
        child.stderr.on("data", (d) => (err += d));
        child.stdout.once("data", (d) => resolve(String(d).trim()));
        child.once("exit", (code) => reject(new Error(`the example exited (${code}): ${err}`)));
      });
      const key = fresh();
      const first = await post(url, { key, path: "/orders" });
      assert.equal(first.status, 201);
      const body = await first.json();
      assert.deepEqual(body.order, JSON.parse(ORDER));
      const retry = await post(url, { key, path: "/orders" });
      assert.equal(retry.headers.get("idempotent-replayed"), "true");
      assert.deepEqual(await retry.json(), body);
      const mismatch = await post(url, { key, path: "/orders", body: '{"amount":1}' });
      assert.equal(mismatch.status, 422);
      assert.equal(mismatch.headers.get("content-type"), "application/problem+json");
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
      await exited;
    }
  });
});
