// What the framework adapters' tests share (test/fastify.test.mjs, test/nestjs.test.mjs): the
// loopback requests they send, and the checks every adapter must pass over real HTTP with a
// running app (IDEM-JS-4): execution once, replays with the stored headers, racing duplicates
// over separate connections, payload mismatch, status queries, and the bad inputs
// (problem+json with a stable type, nothing executed).
//
// An app under test serves POST /api/orders (guarded: counts, waits 40 ms, answers 201 with
// `x-order-id`, or 400 for an order that is not a JSON object), GET /api/orders (unguarded)
// and POST /open/orders (unguarded, counts), with `fingerprint.maxBody` = MAX_BODY and the
// principal from the `x-user` header.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { request } from "node:http";
import { connect } from "node:net";
import { Readable } from "node:stream";
import { test } from "node:test";

export const MAX_BODY = 1024;
export const ORDER = '{"amount":4200,"currency":"eur"}';
export const fresh = () => `"${randomUUID()}"`;

/** A POST over Fetch, bounded so that an app that never answers fails the test. */
export function post(url, { key, body = ORDER, path = "/api/orders", user = "alice", contentType = "application/json" } = {}) {
  const headers = { "content-type": contentType, "x-user": user };
  if (key !== undefined) headers["idempotency-key"] = key;
  return fetch(`${url}${path}`, { method: "POST", headers, body, signal: AbortSignal.timeout(10_000) });
}

/** One HTTP/1.1 request written byte for byte on a connection of its own (for headers Fetch
 * refuses to send, and for duplicates that must not share a connection). `gate` (a promise)
 * holds the request back once connected, so that many are released together. */
export function rawRequest(port, { path = "/api/orders", head = [], body = "", gate } = {}) {
  const payload = Buffer.from(body, "latin1");
  const lines = [`POST ${path} HTTP/1.1`, `host: 127.0.0.1:${port}`, "connection: close", "x-user: alice", ...head, `content-length: ${payload.length}`];
  const request = Buffer.concat([Buffer.from(lines.join("\r\n") + "\r\n\r\n", "latin1"), payload]);
  return new Promise((resolve, reject) => {
    const socket = connect(port, "127.0.0.1");
    const chunks = [];
    socket.setTimeout(10_000, () => socket.destroy(new Error("no answer within 10 s")));
    socket.on("connect", async () => {
      if (gate !== undefined) await gate;
      socket.write(request);
    });
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

/** `n` requests on connections of their own, all connected before any is sent. */
export async function racing(port, n, options) {
  let open;
  const gate = new Promise((resolve) => (open = resolve));
  const answers = Array.from({ length: n }, () => rawRequest(port, { ...options, gate }));
  // Every connection is accepted before the requests go out together.
  await new Promise((resolve) => setTimeout(resolve, 50));
  open();
  return Promise.all(answers);
}

/**
 * Registers the shared checks. `app()` gives the running app under test: `{ url, port,
 * state }` where `state.count` counts the executions of the guarded route. `statusQueries`:
 * whether the adapter answers status queries (a GET with Idempotency-Status).
 */
export function adapterChecks(app, { statusQueries = true } = {}) {
  const count = () => app().state.count;

  /** A problem+json refusal of `status` and `type`, with nothing executed. */
  async function refused(send, status, type) {
    const before = count();
    const r = await send();
    const text = await r.text();
    assert.equal(r.status, status, text);
    assert.equal(r.headers.get("content-type"), "application/problem+json", text);
    const problem = JSON.parse(text);
    assert.equal(problem.type, type, text);
    assert.equal(problem.status, status);
    assert.equal(typeof problem.title, "string");
    assert.equal(count(), before, "nothing executed");
    return problem;
  }

  async function keyStillFresh(key) {
    const before = count();
    const r = await post(app().url, { key });
    assert.equal(r.status, 201, await r.text());
    assert.equal(r.headers.get("idempotent-replayed"), null);
    assert.equal(count(), before + 1);
  }

  test("a request runs once; its retry replays status, body and the stored headers", async () => {
    const key = fresh();
    const first = await post(app().url, { key });
    const body = await first.text();
    assert.equal(first.status, 201, body);
    assert.equal(JSON.parse(body).order.amount, 4200);
    const id = first.headers.get("x-order-id");
    const before = count();
    const retry = await post(app().url, { key });
    assert.equal(retry.status, 201);
    assert.equal(retry.headers.get("idempotent-replayed"), "true");
    assert.equal(retry.headers.get("x-order-id"), id);
    assert.equal(retry.headers.get("content-type"), first.headers.get("content-type"));
    assert.equal(await retry.text(), body);
    assert.equal(count(), before, "the retry ran nothing");
  });

  test("16 duplicates on separate connections released together run once, round after round (IDEM-CONC-1)", async () => {
    for (let round = 0; round < 5; round++) {
      const key = fresh();
      const before = count();
      const answers = await racing(app().port, 16, { head: ["content-type: application/json", `idempotency-key: ${key}`], body: ORDER });
      assert.equal(count() - before, 1, `round ${round}: ${count() - before} executions`);
      for (const a of answers) assert.ok(a.status === 201 || a.status === 409, String(a.status));
      assert.ok(answers.some((a) => a.status === 201));
      const retry = await post(app().url, { key });
      assert.equal(retry.headers.get("idempotent-replayed"), "true");
    }
  });

  test("the same key with another body is refused with 422, and another principal's key is its own", async () => {
    const key = fresh();
    assert.equal((await post(app().url, { key })).status, 201);
    await refused(() => post(app().url, { key, body: '{"amount":1,"currency":"eur"}' }), 422, "urn:idem:problem:key-reuse-mismatch");
    const before = count();
    const bob = await post(app().url, { key, user: "bob", body: '{"amount":1,"currency":"eur"}' });
    assert.equal(bob.status, 201);
    assert.equal(count(), before + 1);
  });

  if (statusQueries) test("a GET with Idempotency-Status is answered from the store in the asker's scope, and a settled key refuses its late original (IDEM-STATUS-1 to IDEM-STATUS-4)", async () => {
    const url = app().url;
    const ask = (key, field, user = "alice") =>
      fetch(`${url}/api/orders`, { headers: { "idempotency-key": key, "idempotency-status": field, "x-user": user } });
    const document = async (r) => {
      const text = await r.text();
      assert.equal(r.status, 200, text);
      assert.equal(r.headers.get("content-type"), "application/vnd.idem.key-status+json");
      assert.equal(r.headers.get("cache-control"), "no-store");
      return JSON.parse(text);
    };
    const key = fresh();
    assert.equal((await document(await ask(key, "POST"))).status, "unknown");
    assert.equal((await post(url, { key })).status, 201);
    assert.deepEqual((await document(await ask(key, "POST"))).response, { replayable: true, status: 201 });
    assert.equal((await document(await ask(key, "POST", "bob"))).status, "unknown");
    const lost = fresh();
    assert.equal((await document(await ask(lost, "POST; settle"))).status, "not-executed");
    await refused(() => post(url, { key: lost }), 409, "urn:idem:problem:key-settled");
    await refused(() => ask(key, "POST; later"), 400, "about:blank");
    await refused(() => ask("not a key", "POST"), 400, "urn:idem:problem:malformed-key");
    // A GET without the field is the route's own.
    const list = await fetch(`${url}/api/orders`, { headers: { "x-user": "alice" } });
    assert.deepEqual(await list.json(), { orders: count() });
  });

  test("an unguarded route runs every time without a key", async () => {
    const before = count();
    assert.equal((await post(app().url, { path: "/open/orders" })).status, 201);
    assert.equal((await post(app().url, { path: "/open/orders" })).status, 201);
    assert.equal(count(), before + 2);
  });

  test("malformed, oversized, missing and repeated keys are refused with 400 (IDEM-KEY-1, IDEM-KEY-3, IDEM-KEY-5, IDEM-KEY-6)", async () => {
    const { url, port } = app();
    const raw = (key) => rawRequest(port, { head: ["content-type: application/json", `idempotency-key: ${key}`], body: ORDER });
    for (const key of ['"unterminated', '"bad\\escape"', '"trailing"junk', '"two", "keys"', "white space", '"tab\there"']) {
      await refused(() => raw(key), 400, "urn:idem:problem:malformed-key");
    }
    await refused(() => raw(Buffer.from([0x22, 0xc3, 0xa9, 0x22]).toString("latin1")), 400, "urn:idem:problem:malformed-key");
    await refused(() => post(url, { key: "k".repeat(256) }), 400, "urn:idem:problem:malformed-key");
    await refused(() => post(url, { key: `"${"k".repeat(4096)}"` }), 400, "urn:idem:problem:malformed-key");
    await refused(() => post(url, {}), 400, "urn:idem:problem:missing-key");
    await refused(() => post(url, { key: '""' }), 400, "urn:idem:problem:missing-key");
    const key = fresh();
    await refused(
      () => rawRequest(port, { head: ["content-type: application/json", `idempotency-key: ${key}`, `idempotency-key: ${fresh()}`], body: ORDER }),
      400,
      "urn:idem:problem:malformed-key",
    );
    await keyStillFresh(key);
  });

  test("invalid JSON is refused with 400 invalid-json before the key is claimed (IDEM-FP-6)", async () => {
    const key = fresh();
    for (const body of ['{"amount":', "{'amount':1}", '{"amount":1}}', "NaN"]) {
      await refused(() => post(app().url, { key, body }), 400, "urn:idem:problem:invalid-json");
    }
    await refused(() => rawRequest(app().port, { head: ["content-type: application/json", `idempotency-key: ${key}`], body: "\xff\xfe" }), 400, "urn:idem:problem:invalid-json");
    await keyStillFresh(key);
  });

  test("bodies over the limit are refused with 413 body-too-large, declared or streamed (IDEM-LIMIT-1)", async () => {
    const key = fresh();
    const big = JSON.stringify({ amount: 1, note: "x".repeat(MAX_BODY) });
    await refused(() => post(app().url, { key, body: big }), 413, "urn:idem:problem:body-too-large");
    await refused(
      () =>
        fetch(`${app().url}/api/orders`, {
          method: "POST",
          headers: { "x-user": "alice", "content-type": "application/json", "idempotency-key": key },
          body: new Blob([big]).stream(),
          duplex: "half",
          signal: AbortSignal.timeout(10_000),
        }),
      413,
      "urn:idem:problem:body-too-large",
    );
    const fits = JSON.stringify({ amount: 1, note: "x".repeat(MAX_BODY - 22) });
    assert.equal(Buffer.byteLength(fits), MAX_BODY);
    const r = await post(app().url, { key, body: fits });
    assert.equal(r.status, 201, await r.text());
    const before = count();
    await checkEndlessUpload(app().port);
    assert.equal(count(), before, "nothing runs");
  });

  test("the app's own 400 (an order that is not an object) is stored and replayed without running again", async () => {
    const key = fresh();
    const before = count();
    const first = await post(app().url, { key, body: "[1,2,3]" });
    assert.equal(first.status, 400);
    const retry = await post(app().url, { key, body: "[1,2,3]" });
    assert.equal(retry.status, 400);
    assert.equal(retry.headers.get("idempotent-replayed"), "true");
    assert.equal(count(), before + 1);
  });
}

/**
 * The store test kit's shared-store case (`idem/store-tests`: 32 concurrent duplicates, two
 * stores on the same data) through a framework: two apps, each on a store of its own from
 * `open()`, the duplicates split across both over separate connections. `start(store)`
 * starts one app and resolves to `{ port, state, close() }`.
 */
export function sharedStoreCheck(name, { open, start }) {
  test(`${name}: 32 duplicates split across two apps on one store run once, and the retries replay it (IDEM-CONC-1)`, async () => {
    const apps = [];
    try {
      apps.push(await start(await open()), await start(await open()));
      const runs = () => apps[0].state.count + apps[1].state.count;
      for (let round = 0; round < 3; round++) {
        const key = fresh();
        const before = runs();
        let open;
        const gate = new Promise((resolve) => (open = resolve));
        const head = ["content-type: application/json", `idempotency-key: ${key}`];
        const answers = Array.from({ length: 32 }, (_, i) => rawRequest(apps[i % 2].port, { head, body: ORDER, gate }));
        await new Promise((resolve) => setTimeout(resolve, 50));
        open();
        const all = await Promise.all(answers);
        assert.equal(runs() - before, 1, `round ${round}: ${runs() - before} executions`);
        for (const a of all) assert.ok(a.status === 201 || a.status === 409, `status ${a.status}`);
        for (const other of apps) {
          const retry = await rawRequest(other.port, { head, body: ORDER });
          assert.equal(retry.status, 201);
          assert.equal(retry.headers.get("idempotent-replayed"), "true");
        }
        assert.equal(runs() - before, 1);
      }
    } finally {
      await Promise.all(apps.map((a) => a.close()));
    }
  });
}

/** A stream that never ends, for an app to send: 16 KiB chunks made as they are read,
 * counted in `state.produced`. */
export function endlessSource(state) {
  state.produced = 0;
  return new Readable({
    read() {
      state.produced += 16_384;
      this.push(Buffer.alloc(16_384, "z"));
    },
  });
}

/** A guarded POST to `path`, whose app sends an `endlessSource(state)` and sets
 * `state.closed` when its response closes, read up to the answer's head and then no further
 * (IDEM-STORE-5): the head comes although the body never ends, the app stops producing while
 * the client reads nothing, and the app's stream closes when the client leaves. */
export async function checkEndlessAnswer(port, path, state) {
  const response = await new Promise((resolve, reject) => {
    const headers = { "idempotency-key": fresh(), "content-type": "application/json", "x-user": "alice" };
    const req = request({ host: "127.0.0.1", port, path, method: "POST", headers }, resolve);
    req.once("error", reject);
    req.setTimeout(5_000, () => req.destroy(new Error("no response head: the answer was held")));
    req.end(ORDER);
  });
  assert.equal(response.statusCode, 200);
  // The client reads nothing more: the app's writes are held back by the socket, and the
  // stream stops (unchanged for half a second, within 10 s however busy the machine).
  response.pause();
  let produced = state.produced;
  for (let still = 0, waited = 0; still < 500; waited += 100) {
    assert.ok(waited < 10_000, `the app's stream never waited for the client: ${state.produced} bytes`);
    await new Promise((resolve) => setTimeout(resolve, 100));
    still = state.produced === produced ? still + 100 : 0;
    produced = state.produced;
  }
  assert.ok(produced < 64 << 20, `produced ${produced} bytes`);
  response.destroy();
  for (let i = 0; i < 100 && !state.closed; i++) await new Promise((resolve) => setTimeout(resolve, 10));
  assert.equal(state.closed, true);
}

/** An upload to the guarded `path` of `port` that never ends (1 KiB chunks, chunked): the
 * answer's head, and whether the server closed the connection within 10 s of it while the
 * client went on sending (IDEM-LIMIT-1: the rest of a refused upload is not read). */
export function endlessUpload(port, path = "/api/orders") {
  return new Promise((resolve, reject) => {
    const socket = connect(port, "127.0.0.1");
    let head = null;
    let sending;
    let waited;
    const done = (closed) => {
      clearInterval(sending);
      clearTimeout(waited);
      socket.destroy();
      if (head === null) reject(new Error("the connection ended before an answer"));
      else resolve({ head, closed });
    };
    let got = "";
    socket.setTimeout(10_000, () => done(false));
    socket.on("connect", () => {
      socket.write(`POST ${path} HTTP/1.1\r\nhost: x\r\nx-user: alice\r\ncontent-type: application/json\r\nidempotency-key: ${fresh()}\r\ntransfer-encoding: chunked\r\n\r\n`);
      const chunk = `400\r\n${"x".repeat(1024)}\r\n`;
      sending = setInterval(() => socket.write(chunk), 1);
    });
    socket.on("data", (d) => {
      if (head !== null) return;
      got += d.toString("latin1");
      const end = got.indexOf("\r\n\r\n");
      if (end < 0) return;
      head = got.slice(0, end);
      socket.setTimeout(0);
      waited = setTimeout(() => done(false), 10_000);
    });
    // The server's end of the connection, or a reset of the writes after it.
    socket.on("end", () => done(true));
    socket.on("error", () => done(true));
  });
}

/** `endlessUpload`, checked: 413 problem+json with `Connection: close`, and the connection
 * closed while the client still sends. */
export async function checkEndlessUpload(port, path) {
  const { head, closed } = await endlessUpload(port, path);
  assert.match(head, /^HTTP\/1\.1 413 /);
  assert.match(head, /\r\ncontent-type: application\/problem\+json/i);
  assert.match(head, /\r\nconnection: close/i);
  assert.equal(closed, true, "the server went on reading the upload after its 413");
}

/** A listening server (Node's http.Server) on `port`, as the framework tests use it:
 * `{ url, port, close() }`, closing its connections too. */
export function opened(server, port) {
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
