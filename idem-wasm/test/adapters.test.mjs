// The framework adapters against their real frameworks over loopback HTTP (IDEM-JS-4): `idem/express`
// on Express 5 and `idem/hono` on Hono with @hono/node-server. The same checks run against
// both: execution once, replays with the stored headers, concurrent duplicates, payload
// mismatch, path/method selection and the skip predicate, the key header's name, the
// problem mapping hook, and the bad inputs of the worker's bad-input test (problem+json,
// nothing executed). Then Hono under middleware mounted before it: one that read the body,
// and CORS and a request id set before it.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { connect } from "node:net";
import { after, before, describe, test } from "node:test";
import { serve as honoServe } from "@hono/node-server";
import express from "express";
import { Hono } from "hono";
import { cors } from "hono/cors";
import { validator } from "hono/validator";
import { MemoryStore } from "idem";
import { idempotency as expressIdempotency } from "idem/express";
import { idempotency as honoIdempotency } from "idem/hono";

const MAX_BODY = 1024;
const ORDER = '{"amount":4200,"currency":"eur"}';
const fresh = () => `"${randomUUID()}"`;

/** Both apps: POST /api/orders (protected), POST /api/search (skipped), POST /open/orders
 * (outside the protected path), GET /count. `customKey`: the key header is X-Request-Key;
 * `mapped`: refusals go through the problem hook. */
function expressApp({ customKey = false, mapped = false } = {}) {
  const state = { count: 0 };
  const app = express();
  app.use(
    "/api",
    expressIdempotency({
      store: new MemoryStore(),
      principal: (req) => req.get("x-user") ?? "",
      fingerprint: { maxBody: MAX_BODY },
      skip: (req) => req.path === "/search",
      ...(customKey ? { keyHeader: "X-Request-Key" } : {}),
      ...(mapped ? { problem: mapProblem } : {}),
    }),
  );
  app.use(express.json());
  app.post("/api/orders", async (req, res) => {
    state.count++;
    const id = state.count;
    await new Promise((resolve) => setTimeout(resolve, 40));
    if (req.body === null || typeof req.body !== "object" || Array.isArray(req.body)) {
      return res.status(400).json({ error: "invalid order" });
    }
    res.status(201).set("x-order-id", String(id)).json({ id, order: req.body, key: req.idempotency?.key });
  });
  app.get("/api/orders", (req, res) => res.json({ orders: state.count }));
  app.post("/api/search", (req, res) => res.json({ searched: true, body: req.body }));
  app.post("/open/orders", (req, res) => {
    state.count++;
    res.status(201).json({ open: true });
  });
  app.get("/count", (req, res) => res.json({ count: state.count }));
  return { state, listen: () => listenExpress(app) };
}

function honoApp({ customKey = false, mapped = false } = {}) {
  const state = { count: 0 };
  const app = new Hono();
  app.use(
    "/api/*",
    honoIdempotency({
      store: new MemoryStore(),
      principal: (c) => c.req.header("x-user") ?? "",
      fingerprint: { maxBody: MAX_BODY },
      skip: (c) => c.req.path === "/api/search",
      ...(customKey ? { keyHeader: "X-Request-Key" } : {}),
      ...(mapped ? { problem: mapProblem } : {}),
    }),
  );
  app.post("/api/orders", async (c) => {
    state.count++;
    const id = state.count;
    await new Promise((resolve) => setTimeout(resolve, 40));
    let order;
    try {
      order = await c.req.json();
    } catch {
      order = null;
    }
    if (order === null || typeof order !== "object" || Array.isArray(order)) return c.json({ error: "invalid order" }, 400);
    return c.json({ id, order }, 201, { "x-order-id": String(id) });
  });
  app.get("/api/orders", (c) => c.json({ orders: state.count }));
  app.post("/api/search", async (c) => c.json({ searched: true, body: await c.req.json() }));
  app.post("/open/orders", (c) => {
    state.count++;
    return c.json({ open: true }, 201);
  });
  app.get("/count", (c) => c.json({ count: state.count }));
  return {
    state,
    listen: () =>
      new Promise((resolve) => {
        const server = honoServe({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, (info) => resolve(opened(server, info.port)));
      }),
  };
}

function mapProblem(problem) {
  return Response.json({ error: { code: problem.type.replace("urn:idem:problem:", ""), message: problem.title } }, { status: problem.status });
}

function listenExpress(app) {
  return new Promise((resolve) => {
    const server = app.listen(0, "127.0.0.1", () => resolve(opened(server, server.address().port)));
  });
}

function opened(server, port) {
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections?.();
        server.close(() => resolve());
      }),
  };
}

function post(url, { key, body = ORDER, path = "/api/orders", user = "alice", header = "idempotency-key", contentType = "application/json" } = {}) {
  const headers = { "content-type": contentType, "x-user": user };
  if (key !== undefined) headers[header] = key;
  return fetch(`${url}${path}`, { method: "POST", headers, body });
}

/** One HTTP/1.1 request written byte for byte (for headers Fetch refuses to send). */
function rawRequest(port, { path = "/api/orders", head = [], body = "" }) {
  const payload = Buffer.from(body, "latin1");
  const lines = [`POST ${path} HTTP/1.1`, `host: 127.0.0.1:${port}`, "connection: close", "x-user: alice", ...head, `content-length: ${payload.length}`];
  const request = Buffer.concat([Buffer.from(lines.join("\r\n") + "\r\n\r\n", "latin1"), payload]);
  return new Promise((resolve, reject) => {
    const socket = connect(port, "127.0.0.1");
    const chunks = [];
    socket.on("connect", () => socket.write(request));
    socket.on("data", (c) => chunks.push(c));
    socket.on("error", reject);
    socket.on("close", () => {
      const all = Buffer.concat(chunks);
      const end = all.indexOf("\r\n\r\n");
      const [status, ...fields] = all.subarray(0, end).toString("latin1").split("\r\n");
      const headers = new Headers();
      for (const f of fields) {
        const i = f.indexOf(":");
        headers.append(f.slice(0, i).trim(), f.slice(i + 1).trim());
      }
      let rest = all.subarray(end + 4);
      if (headers.get("transfer-encoding") === "chunked") {
        const parts = [];
        for (;;) {
          const eol = rest.indexOf("\r\n");
          const size = parseInt(rest.subarray(0, eol).toString("latin1"), 16);
          if (!size) break;
          parts.push(rest.subarray(eol + 2, eol + 2 + size));
          rest = rest.subarray(eol + 4 + size);
        }
        rest = Buffer.concat(parts);
      }
      const text = rest.toString("utf8");
      resolve({ status: Number(status.split(" ")[1]), headers, text: async () => text });
    });
  });
}

for (const [name, make] of [
  ["express", expressApp],
  ["hono", honoApp],
]) {
  describe(`idem/${name} on ${name === "express" ? "Express 5" : "Hono"}`, () => {
    let app;
    let server;
    before(async () => {
      app = make();
      server = await app.listen();
    });
    after(async () => server?.close());

    async function count() {
      return (await (await fetch(`${server.url}/count`)).json()).count;
    }

    /** A problem+json refusal of `status` and `type`, with nothing executed. */
    async function refused(send, status, type) {
      const before = app.state.count;
      const r = await send();
      const text = await r.text();
      assert.equal(r.status, status, text);
      assert.equal(r.headers.get("content-type"), "application/problem+json", text);
      const problem = JSON.parse(text);
      assert.equal(problem.type, type, text);
      assert.equal(problem.status, status);
      assert.equal(typeof problem.title, "string");
      assert.equal(app.state.count, before, "nothing executed");
      return problem;
    }

    async function keyStillFresh(key) {
      const before = app.state.count;
      const r = await post(server.url, { key });
      assert.equal(r.status, 201, await r.text());
      assert.equal(r.headers.get("idempotent-replayed"), null);
      assert.equal(app.state.count, before + 1);
    }

    test("a request runs once; its retry replays status, body and the stored headers", async () => {
      const key = fresh();
      const first = await post(server.url, { key });
      assert.equal(first.status, 201);
      const body = await first.text();
      assert.equal(JSON.parse(body).order.amount, 4200);
      const id = first.headers.get("x-order-id");
      const retry = await post(server.url, { key });
      assert.equal(retry.status, 201);
      assert.equal(retry.headers.get("idempotent-replayed"), "true");
      assert.equal(retry.headers.get("x-order-id"), id);
      assert.equal(retry.headers.get("content-type"), first.headers.get("content-type"));
      assert.equal(await retry.text(), body);
      assert.equal(await count(), Number(id));
    });

    test("a GET with Idempotency-Status is answered from the store in the asker's scope, and a settled key refuses its late original (IDEM-STATUS-1 to IDEM-STATUS-4)", async () => {
      const ask = (key, field, user = "alice") =>
        fetch(`${server.url}/api/orders`, { headers: { "idempotency-key": key, "idempotency-status": field, "x-user": user } });
      const document = async (r) => {
        const text = await r.text();
        assert.equal(r.status, 200, text);
        assert.equal(r.headers.get("content-type"), "application/vnd.idem.key-status+json");
        assert.equal(r.headers.get("cache-control"), "no-store");
        return JSON.parse(text);
      };
      const key = fresh();
      assert.equal((await document(await ask(key, "POST"))).status, "unknown");
      assert.equal((await post(server.url, { key })).status, 201);
      const done = await document(await ask(key, "POST"));
      assert.deepEqual(done.response, { replayable: true, status: 201 });
      assert.equal((await document(await ask(key, "POST", "bob"))).status, "unknown");
      const lost = fresh();
      assert.equal((await document(await ask(lost, "POST; settle"))).status, "not-executed");
      await refused(() => post(server.url, { key: lost }), 409, "urn:idem:problem:key-settled");
      await refused(() => ask(key, "POST; later"), 400, "about:blank");
      await refused(() => ask(key, "GET"), 400, "about:blank");
      await refused(() => ask("not a key", "POST"), 400, "urn:idem:problem:malformed-key");
      // A GET without the field is the route's own.
      const list = await fetch(`${server.url}/api/orders`, { headers: { "x-user": "alice" } });
      assert.deepEqual(await list.json(), { orders: app.state.count });
    });

    test("16 concurrent duplicates over separate connections run once", async () => {
      for (let round = 0; round < 3; round++) {
        const key = fresh();
        const before = app.state.count;
        const answers = await Promise.all(
          Array.from({ length: 16 }, () => rawRequest(server.port, { head: ["content-type: application/json", `idempotency-key: ${key}`], body: ORDER })),
        );
        assert.equal(app.state.count - before, 1);
        for (const a of answers) assert.ok(a.status === 201 || a.status === 409, String(a.status));
        assert.ok(answers.some((a) => a.status === 201));
      }
    });

    test("the same key with another body is refused with 422, and another principal's key is its own", async () => {
      const key = fresh();
      assert.equal((await post(server.url, { key })).status, 201);
      await refused(() => post(server.url, { key, body: '{"amount":1,"currency":"eur"}' }), 422, "urn:idem:problem:key-reuse-mismatch");
      const before = app.state.count;
      const bob = await post(server.url, { key, user: "bob", body: '{"amount":1,"currency":"eur"}' });
      assert.equal(bob.status, 201);
      assert.equal(app.state.count, before + 1);
    });

    test("only the protected path and methods are guarded; skip lets a request through", async () => {
      const before = app.state.count;
      // Outside the protected path: no key needed, runs every time.
      assert.equal((await post(server.url, { path: "/open/orders" })).status, 201);
      assert.equal((await post(server.url, { path: "/open/orders" })).status, 201);
      assert.equal(app.state.count, before + 2);
      // Skipped: no key needed.
      const s = await post(server.url, { path: "/api/search", body: '{"q":"x"}' });
      assert.equal(s.status, 200);
      assert.deepEqual(await s.json(), { searched: true, body: { q: "x" } });
      // GET is not guarded.
      assert.equal((await fetch(`${server.url}/count`)).status, 200);
    });

    test("oversized keys are refused with 400 malformed-key (IDEM-KEY-6)", async () => {
      await refused(() => post(server.url, { key: "k".repeat(256) }), 400, "urn:idem:problem:malformed-key");
      await refused(() => post(server.url, { key: `"${"k".repeat(4096)}"` }), 400, "urn:idem:problem:malformed-key");
      // The boundary: 255 characters is a key.
      assert.equal((await post(server.url, { key: `"${(randomUUID() + "k".repeat(255)).slice(0, 255)}"` })).status, 201);
    });

    test("malformed sf-strings and bad key bytes are refused with 400 malformed-key (IDEM-KEY-1)", async () => {
      for (const key of ['"unterminated', '"bad\\escape"', '"trailing"junk', '"two", "keys"', "white space", '"tab\there"']) {
        await refused(() => rawRequest(server.port, { head: ["content-type: application/json", `idempotency-key: ${key}`], body: ORDER }), 400, "urn:idem:problem:malformed-key");
      }
      const raw = (bytes) => rawRequest(server.port, { head: ["content-type: application/json", `idempotency-key: ${Buffer.from(bytes).toString("latin1")}`], body: ORDER });
      await refused(() => raw([0x22, 0xc3, 0xa9, 0x22]), 400, "urn:idem:problem:malformed-key");
      // Control bytes never reach the app: Node's HTTP parser answers a bare 400 itself.
      for (const bytes of [[0x22, 0x01, 0x22], [0x22, 0x7f, 0x22]]) {
        const before = app.state.count;
        assert.equal((await raw(bytes)).status, 400);
        assert.equal(app.state.count, before);
      }
    });

    test("missing, empty and repeated keys are refused with 400 (IDEM-KEY-3, IDEM-KEY-5)", async () => {
      await refused(() => post(server.url, {}), 400, "urn:idem:problem:missing-key");
      await refused(() => post(server.url, { key: "" }), 400, "urn:idem:problem:missing-key");
      await refused(() => post(server.url, { key: '""' }), 400, "urn:idem:problem:missing-key");
      const key = fresh();
      await refused(
        () => rawRequest(server.port, { head: ["content-type: application/json", `idempotency-key: ${key}`, `idempotency-key: ${fresh()}`], body: ORDER }),
        400,
        "urn:idem:problem:malformed-key",
      );
      await keyStillFresh(key);
    });

    test("invalid JSON is refused with 400 invalid-json before the key is claimed (IDEM-FP-6)", async () => {
      const key = fresh();
      for (const body of ['{"amount":', "{'amount':1}", '{"amount":1}}', "NaN"]) {
        await refused(() => post(server.url, { key, body }), 400, "urn:idem:problem:invalid-json");
      }
      await refused(() => rawRequest(server.port, { head: ["content-type: application/json", `idempotency-key: ${key}`], body: "\xff\xfe" }), 400, "urn:idem:problem:invalid-json");
      await keyStillFresh(key);
    });

    test("bodies over the limit are refused with 413 body-too-large, declared or streamed (IDEM-LIMIT-1)", async () => {
      const key = fresh();
      const big = JSON.stringify({ amount: 1, note: "x".repeat(MAX_BODY) });
      await refused(() => post(server.url, { key, body: big }), 413, "urn:idem:problem:body-too-large");
      await refused(
        () =>
          fetch(`${server.url}/api/orders`, {
            method: "POST",
            headers: { "x-user": "alice", "content-type": "application/json", "idempotency-key": key },
            body: new Blob([big]).stream(),
            duplex: "half",
          }),
        413,
        "urn:idem:problem:body-too-large",
      );
      const fits = JSON.stringify({ amount: 1, note: "x".repeat(MAX_BODY - 22) });
      assert.equal(Buffer.byteLength(fits), MAX_BODY);
      const r = await post(server.url, { key, body: fits });
      assert.equal(r.status, 201, await r.text());
    });

    test("an order that is not a JSON object is refused by the app, stored, and replayed without running again", async () => {
      const key = fresh();
      const before = app.state.count;
      const first = await post(server.url, { key, body: "[1,2,3]" });
      assert.equal(first.status, 400);
      const retry = await post(server.url, { key, body: "[1,2,3]" });
      assert.equal(retry.status, 400);
      assert.equal(retry.headers.get("idempotent-replayed"), "true");
      assert.equal(app.state.count, before + 1);
    });
  });

  describe(`idem/${name}: the key header's name and the problem hook are options`, () => {
    let app;
    let server;
    before(async () => {
      app = make({ customKey: true, mapped: true });
      server = await app.listen();
    });
    after(async () => server?.close());

    test("X-Request-Key carries the key, and refusals come in the host's own error format", async () => {
      const key = fresh();
      assert.equal((await post(server.url, { key, header: "x-request-key" })).status, 201);
      const retry = await post(server.url, { key, header: "x-request-key" });
      assert.equal(retry.headers.get("idempotent-replayed"), "true");
      assert.equal(app.state.count, 1);
      // Idempotency-Key is not the key header here: the request has no key.
      const missing = await post(server.url, { key });
      assert.equal(missing.status, 400);
      assert.match(missing.headers.get("content-type"), /^application\/json/);
      assert.deepEqual(await missing.json(), { error: { code: "missing-key", message: "Idempotency-Key header is required" } });
      const mismatch = await post(server.url, { key, header: "x-request-key", body: '{"amount":2}' });
      assert.equal(mismatch.status, 422);
      assert.equal((await mismatch.json()).error.code, "key-reuse-mismatch");
      assert.equal(app.state.count, 1);
      // The app's own 4xx answer, and its replay, are never mapped: only the engine's refusals.
      const other = fresh();
      for (const replay of [false, true]) {
        const own = await post(server.url, { key: other, header: "x-request-key", body: "[1,2,3]" });
        assert.equal(own.status, 400);
        assert.equal(own.headers.get("idempotent-replayed"), replay ? "true" : null);
        assert.deepEqual(await own.json(), { error: "invalid order" });
      }
      assert.equal(app.state.count, 2);
    });
  });
}

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
