// The framework adapters against their real frameworks over loopback HTTP (IDEM-JS-4): `idem/express`
// on Express 5 and `idem/hono` on Hono with @hono/node-server. The same checks run against
// both: execution once, replays with the stored headers, concurrent duplicates, payload
// mismatch, path/method selection and the skip predicate, the key header's name, the
// problem mapping hook, and the bad inputs of the worker's bad-input test (problem+json,
// nothing executed). Hono under middleware mounted before it: hono-middleware.test.mjs.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { connect } from "node:net";
import { after, before, describe, test } from "node:test";
import { serve as honoServe } from "@hono/node-server";
import express from "express";
import { Hono } from "hono";
import { MemoryStore } from "idem";
import { idempotency as expressIdempotency } from "idem/express";
import { idempotency as honoIdempotency } from "idem/hono";
import { opened } from "./framework-http.mjs";

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
