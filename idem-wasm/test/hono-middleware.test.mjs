// `idem/hono` on Hono with @hono/node-server, under middleware mounted before it (IDEM-JS-4,
// IDEM-JS-10): one that read the body (c.req.json(), a validator, c.req.arrayBuffer(), text,
// or the raw body past Hono's cache), and CORS, a request id and a cookie set before it.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { serve as honoServe } from "@hono/node-server";
import { Hono } from "hono";
import { cors } from "hono/cors";
import { validator } from "hono/validator";
import { MemoryStore, idempotencyOf } from "idem";
import { idempotency as honoIdempotency } from "idem/hono";
import { ORDER, fresh, opened } from "./framework-http.mjs";

/** A Hono app over loopback HTTP, as `honoApp` serves it. */
function listenHono(app) {
  return new Promise((resolve) => {
    const server = honoServe({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, (info) => resolve(opened(server, info.port)));
  });
}

describe("idem/hono after middleware that read the body (IDEM-JS-4, IDEM-JS-10)", () => {
  let server;
  let runs = 0;
  before(async () => {
    const app = new Hono();
    // What validators, loggers and signature checks mounted first do.
    app.use("/json/*", async (c, next) => {
      await c.req.json();
      await next();
    });
    app.use("/valid/*", validator("json", (value) => value));
    app.use("/bytes/*", async (c, next) => {
      await c.req.arrayBuffer();
      await next();
    });
    app.use("/text/*", async (c, next) => {
      await c.req.text();
      await next();
    });
    // Past Hono's body cache: nothing kept the bytes.
    app.use("/raw/*", async (c, next) => {
      await c.req.raw.arrayBuffer();
      await next();
    });
    app.use("*", honoIdempotency({ store: new MemoryStore(), principal: "none" }));
    app.post("*", async (c) => c.json({ run: ++runs, body: await c.req.text() }, 201));
    server = await listenHono(app);
  });
  after(async () => server?.close());

  const send = (path, key, body, contentType = "application/json") =>
    fetch(`${server.url}${path}`, { method: "POST", headers: { "content-type": contentType, "idempotency-key": key }, body });

  async function problem(r, status, type) {
    const text = await r.text();
    assert.equal(r.status, status, text);
    assert.equal(r.headers.get("content-type"), "application/problem+json", text);
    assert.equal(JSON.parse(text).type, type, text);
  }

  for (const path of ["/json/orders", "/valid/orders", "/bytes/orders"]) {
    test(`${path}: the request runs once with its body, its retry replays, and another payload under its key is refused with 422`, async () => {
      const key = fresh();
      const first = await send(path, key, ORDER);
      const answer = await first.text();
      assert.equal(first.status, 201, answer);
      assert.equal(JSON.parse(answer).body, ORDER, "the handler reads the body too");
      const retry = await send(path, key, ORDER);
      assert.equal(retry.status, 201);
      assert.equal(retry.headers.get("idempotent-replayed"), "true");
      assert.equal(await retry.text(), answer);
      await problem(await send(path, key, '{"amount":1,"currency":"eur"}'), 422, "urn:idem:problem:key-reuse-mismatch");
    });
  }

  test("a text body is fingerprinted from the bytes sent; one whose text does not give them back is a problem, and nothing runs", async () => {
    const key = fresh();
    const first = await send("/text/notes", key, "hello", "text/plain");
    assert.equal(first.status, 201, await first.text());
    assert.equal((await send("/text/notes", key, "hello", "text/plain")).headers.get("idempotent-replayed"), "true");
    await problem(await send("/text/notes", key, "hellO", "text/plain"), 422, "urn:idem:problem:key-reuse-mismatch");
    const ran = runs;
    // A byte-order mark (dropped when decoded) and malformed UTF-8 (decoded as U+FFFD).
    await problem(await send("/text/notes", fresh(), "\uFEFFhello", "text/plain"), 500, "about:blank");
    await problem(await send("/text/notes", fresh(), new Uint8Array([0x68, 0xff, 0x69]), "text/plain"), 500, "about:blank");
    assert.equal(runs, ran);
  });

  test("a body read past Hono's cache (c.req.raw) is answered with a problem, not a crash, and nothing runs", async () => {
    const ran = runs;
    await problem(await send("/raw/orders", fresh(), ORDER), 500, "about:blank");
    assert.equal(runs, ran);
  });
});

describe("idem/hono under middleware that set headers before it (IDEM-JS-4, IDEM-JS-10)", () => {
  /** CORS for two origins, a request id (from `x-req`) and a cookie before idem, and
   * `x-served-by` set both before idem and by the handler, which sets a cookie of its own
   * and waits for `release()`. */
  async function corsApp() {
    const state = { runs: 0 };
    let started;
    state.running = new Promise((resolve) => (started = resolve));
    const held = new Promise((resolve) => (state.release = resolve));
    const app = new Hono();
    app.use("*", cors({ origin: ["https://a.example", "https://b.example"] }));
    app.use("*", async (c, next) => {
      c.header("x-request-id", c.req.header("x-req") ?? "none");
      c.header("x-served-by", "outer");
      c.header("set-cookie", `sid=${c.req.header("x-req")}`, { append: true });
      await next();
    });
    app.use("/orders", honoIdempotency({ store: new MemoryStore(), principal: "none" }));
    app.post("/orders", async (c) => {
      const id = ++state.runs;
      started();
      await held;
      c.header("x-served-by", "handler");
      c.header("set-cookie", `cart=${id}`, { append: true });
      return c.json({ id }, 201, { "x-order-id": String(id) });
    });
    state.server = await listenHono(app);
    return state;
  }

  const send = (server, origin, req, { key = '"k1"', body = ORDER } = {}) =>
    fetch(`${server.url}/orders`, { method: "POST", headers: { origin, "x-req": req, "idempotency-key": key, "content-type": "application/json" }, body });
  const fields = (r) => ({
    origin: r.headers.get("access-control-allow-origin"),
    request: r.headers.get("x-request-id"),
    servedBy: r.headers.get("x-served-by"),
    vary: r.headers.get("vary"),
    cookies: r.headers.getSetCookie().sort(),
  });

  test("its refusals (409 in progress, 422 mismatch, 400 bad key) carry the CORS headers, request id and cookie of the request they answer", async () => {
    const app = await corsApp();
    let pending;
    try {
      pending = send(app.server, "https://a.example", "r1");
      await app.running;
      const busy = await send(app.server, "https://a.example", "r2");
      assert.equal(busy.status, 409, await busy.text());
      assert.equal(busy.headers.get("content-type"), "application/problem+json");
      assert.deepEqual(fields(busy), { origin: "https://a.example", request: "r2", servedBy: "outer", vary: "Origin", cookies: ["sid=r2"] });
      app.release();
      assert.equal((await pending).status, 201);
      const mismatch = await send(app.server, "https://b.example", "r3", { body: '{"amount":1,"currency":"eur"}' });
      assert.equal(mismatch.status, 422);
      assert.equal(mismatch.headers.get("content-type"), "application/problem+json");
      assert.deepEqual(fields(mismatch), { origin: "https://b.example", request: "r3", servedBy: "outer", vary: "Origin", cookies: ["sid=r3"] });
      const bad = await send(app.server, "https://a.example", "r4", { key: "" });
      assert.equal(bad.status, 400);
      assert.equal(bad.headers.get("content-type"), "application/problem+json");
      assert.deepEqual(fields(bad), { origin: "https://a.example", request: "r4", servedBy: "outer", vary: "Origin", cookies: ["sid=r4"] });
      assert.equal(app.runs, 1);
    } finally {
      app.release();
      await pending?.catch(() => {});
      await app.server.close();
    }
  });

  test("a replay carries the retry's own CORS headers, request id and cookie, never the first request's; the stored answer's headers replace those of the same names (IDEM-REPLAY-4, as IDEM-JS-7 says for Express)", async () => {
    const app = await corsApp();
    app.release();
    try {
      const first = await send(app.server, "https://a.example", "r1");
      const answer = await first.text();
      assert.equal(first.status, 201, answer);
      assert.deepEqual(fields(first), { origin: "https://a.example", request: "r1", servedBy: "handler", vary: "Origin", cookies: ["cart=1", "sid=r1"] });
      const replay = await send(app.server, "https://b.example", "r2");
      assert.equal(replay.status, 201);
      assert.equal(replay.headers.get("idempotent-replayed"), "true");
      assert.deepEqual(fields(replay), { origin: "https://b.example", request: "r2", servedBy: "handler", vary: "Origin", cookies: ["cart=1", "sid=r2"] });
      assert.equal(replay.headers.get("x-order-id"), "1");
      assert.equal(replay.headers.get("content-type"), first.headers.get("content-type"));
      assert.equal(await replay.text(), answer);
      // An origin CORS does not allow gets no Access-Control-Allow-Origin, not the first one's.
      const stranger = await send(app.server, "https://evil.example", "r3");
      assert.equal(stranger.headers.get("idempotent-replayed"), "true");
      assert.deepEqual(fields(stranger), { origin: null, request: "r3", servedBy: "handler", vary: "Origin", cookies: ["cart=1", "sid=r3"] });
      assert.equal(app.runs, 1);
    } finally {
      await app.server.close();
    }
  });
});

describe("idem/hono: headers set before it leave the answers the context builds as they are (IDEM-JS-5, IDEM-STORE-5)", () => {
  test("a stream given to the context's respond() is read no further than the store keeps, CORS or not", async () => {
    for (const withCors of [false, true]) {
      let runs = 0;
      let pulled = 0;
      // Ended with the test, so that a source nobody reads any more keeps nothing running.
      let stopped = false;
      const app = new Hono();
      if (withCors) app.use("*", cors({ origin: "*" }));
      app.use("/export", honoIdempotency({ store: new MemoryStore(), principal: "none", maxResponseBytes: 1024, lease: 3_000 }));
      app.post("/export", (c) => {
        runs++;
        // An endless export: 1 KiB at a time.
        const source = new ReadableStream({
          async pull(controller) {
            await new Promise((resolve) => setTimeout(resolve, 5));
            if (stopped) return controller.close();
            pulled++;
            controller.enqueue(new Uint8Array(1024).fill(7));
          },
        });
        return idempotencyOf(c.req.raw).respond(source, { status: 200, headers: { "content-type": "application/octet-stream" } });
      });
      const server = await listenHono(app);
      try {
        const key = fresh();
        const started = Date.now();
        const abort = new AbortController();
        const first = await fetch(`${server.url}/export`, { method: "POST", headers: { "idempotency-key": key, origin: "https://a.example" }, body: "x", signal: abort.signal });
        assert.equal(first.status, 200, `cors ${withCors}`);
        assert.ok(Date.now() - started < 2_000, `cors ${withCors}: the answer waited ${Date.now() - started} ms`);
        assert.ok(pulled < 20, `cors ${withCors}: ${pulled} KiB read before the answer`);
        if (withCors) assert.equal(first.headers.get("access-control-allow-origin"), "*");
        const reader = first.body.getReader();
        assert.equal((await reader.read()).value.byteLength > 0, true);
        abort.abort();
        const retry = await fetch(`${server.url}/export`, { method: "POST", headers: { "idempotency-key": key }, body: "x", signal: AbortSignal.timeout(5_000) });
        assert.equal(retry.status, 410, `cors ${withCors}`);
        assert.equal((await retry.json()).type, "urn:idem:problem:response-not-stored");
        assert.equal(runs, 1);
      } finally {
        stopped = true;
        await server.close();
      }
    }
  });

  test("bytes given to respond() are stored as given; a header the handler set and one set before both reach the client", async () => {
    const app = new Hono();
    app.use("*", cors({ origin: "*" }));
    app.use("/orders", honoIdempotency({ store: new MemoryStore(), principal: "none" }));
    let runs = 0;
    app.post("/orders", (c) => idempotencyOf(c.req.raw).json({ id: ++runs }, { status: 201, headers: { "x-order-id": String(runs) } }));
    const server = await listenHono(app);
    try {
      const key = fresh();
      const send = () => fetch(`${server.url}/orders`, { method: "POST", headers: { "idempotency-key": key, origin: "https://a.example", "content-type": "application/json" }, body: ORDER });
      const first = await send();
      assert.equal(first.status, 201);
      assert.deepEqual(await first.json(), { id: 1 });
      assert.equal(first.headers.get("access-control-allow-origin"), "*");
      const replay = await send();
      assert.equal(replay.headers.get("idempotent-replayed"), "true");
      assert.deepEqual(await replay.json(), { id: 1 });
      assert.equal(replay.headers.get("x-order-id"), "1");
      assert.equal(replay.headers.get("access-control-allow-origin"), "*");
      assert.equal(runs, 1);
    } finally {
      await server.close();
    }
  });
});

describe("idem/hono: a route that returns no answer", () => {
  test("is answered as Hono answers it (its not-found handler), and that answer is what a retry gets", async () => {
    let runs = 0;
    const app = new Hono();
    app.notFound((c) => c.json({ error: "no answer" }, 404));
    app.use("/pay", honoIdempotency({ store: new MemoryStore(), principal: "none" }));
    app.post("/pay", async (c) => {
      runs++;
      await c.req.json();
      // A forgotten `return`.
    });
    const server = await listenHono(app);
    try {
      const key = fresh();
      const send = () => fetch(`${server.url}/pay`, { method: "POST", headers: { "idempotency-key": key, "content-type": "application/json" }, body: ORDER, signal: AbortSignal.timeout(5_000) });
      const first = await send();
      assert.equal(first.status, 404);
      assert.deepEqual(await first.json(), { error: "no answer" });
      const retry = await send();
      assert.equal(retry.status, 404);
      assert.equal(retry.headers.get("idempotent-replayed"), "true");
      assert.deepEqual(await retry.json(), { error: "no answer" });
      assert.equal(runs, 1);
    } finally {
      await server.close();
    }
  });
});
