// `idem/express` where it meets the rest of an Express 5 app, over loopback HTTP: every error
// goes to Express's error handling (IDEM-JS-7), the first answer the app completes is the
// one sent, stored and replayed (IDEM-JS-7), a replay's headers replace those that earlier
// middleware set (IDEM-REPLAY-4), and a body that a parser mounted before the adapter has
// read is refused, never fingerprinted as empty (IDEM-JS-6, IDEM-FP-1), and one that is not
// JSON stays in the request for the parsers after the adapter (IDEM-JS-11).
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, afterEach, before, describe, test } from "node:test";
import express from "express";
import multer from "multer";
import { MemoryStore } from "idem";
import { idempotency } from "idem/express";

const ORDER = '{"amount":4200,"currency":"eur"}';
const fresh = () => `"${randomUUID()}"`;
const delay = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// An error no one handles would end the process (or, here, be reported against the test
// file): each test checks that none happened.
const unhandled = [];
const onUnhandled = (reason) => unhandled.push(reason);
before(() => process.on("unhandledRejection", onUnhandled));
after(() => process.off("unhandledRejection", onUnhandled));
afterEach(async () => {
  await delay(20);
  assert.deepEqual(unhandled.splice(0), [], "no unhandled rejection");
});

/** An app with the adapter on /api: `before(app)` mounts what comes first, `routes(app,
 * state)` the routes; the errors Express's error handling receives are kept, and answered
 * with 500 `{ error, code }`. */
function makeApp({ before: first, routes, store = new MemoryStore(), ...options }) {
  const state = { count: 0, errors: [] };
  const app = express();
  first?.(app);
  app.use("/api", idempotency({ store, principal: "none", ...options }));
  routes(app, state);
  app.use((err, req, res, next) => {
    state.errors.push(err);
    res.status(500).json({ error: err.message, code: err.code });
  });
  return { state, app };
}

function listen(app) {
  return new Promise((resolve) => {
    const server = app.listen(0, "127.0.0.1", () =>
      resolve({
        url: `http://127.0.0.1:${server.address().port}`,
        close: () =>
          new Promise((done) => {
            server.closeAllConnections();
            server.close(() => done());
          }),
      }),
    );
  });
}

function post(url, { key, body = ORDER, path = "/api/orders", contentType = "application/json" } = {}) {
  const headers = { "content-type": contentType };
  if (key !== undefined) headers["idempotency-key"] = key;
  // A bound, so that a request the app never answers fails the test instead of hanging it.
  return fetch(`${url}${path}`, { method: "POST", headers, body, signal: AbortSignal.timeout(5_000) });
}

/** The order route: counts, answers 201 with the order, then does `then(next)`. */
function orderRoute(then = () => {}) {
  return (app, state) => {
    app.use(express.json());
    app.post("/api/orders", (req, res, next) => {
      const id = ++state.count;
      res.status(201).set("x-order-id", String(id)).json({ id, order: req.body });
      then(next);
    });
  };
}

describe("idem/express: errors go to Express's error handling (IDEM-JS-7)", () => {
  test("a problem hook that throws reaches the app's error handler, and the process lives on", async () => {
    const { state, app } = makeApp({
      routes: orderRoute(),
      problem: () => {
        throw new Error("the problem hook failed");
      },
    });
    const server = await listen(app);
    try {
      for (let i = 0; i < 2; i++) {
        const r = await post(server.url, {});
        assert.equal(r.status, 500);
        assert.deepEqual(await r.json(), { error: "the problem hook failed" });
      }
      assert.equal(state.errors.length, 2);
      assert.equal(state.count, 0, "nothing executed");
    } finally {
      await server.close();
    }
  });
});

describe("idem/express: the first answer the app completes is the one sent, stored and replayed (IDEM-JS-7)", () => {
  const slowStore = () => {
    // The memory store behind the asynchronous store contract, each write taking 30 ms as a
    // network store's does: Express's final handler runs while the answer is being stored.
    const inner = new MemoryStore();
    return { load: (key) => inner.load(key), apply: async (key, write, now) => (await delay(30), inner.apply(key, write, now)) };
  };
  const cases = [
    ["answers, then calls next() (an app 404 handler after it)", { then: (next) => next(), notFound: true, errors: 0 }],
    ["answers, then calls next() (Express's final handler; a store that takes time)", { then: (next) => next(), store: slowStore(), errors: 0 }],
    [
      "answers, then throws",
      {
        then: () => {
          throw new Error("thrown after answering");
        },
        errors: 1,
      },
    ],
    ["answers, then passes an error to next()", { then: (next) => next(new Error("passed after answering")), errors: 1 }],
  ];
  for (const [name, { then, notFound = false, store, errors }] of cases) {
    test(`a route that ${name}`, async () => {
      const { state, app } = makeApp({
        store,
        routes: (app, state) => {
          orderRoute(then)(app, state);
          if (notFound) app.use((req, res) => res.status(404).json({ error: "not found" }));
        },
      });
      const server = await listen(app);
      try {
        const key = fresh();
        const first = await post(server.url, { key });
        const body = await first.text();
        assert.equal(first.status, 201, body);
        assert.deepEqual(JSON.parse(body), { id: 1, order: JSON.parse(ORDER) });
        assert.equal(first.headers.get("x-order-id"), "1");
        const retry = await post(server.url, { key });
        assert.equal(retry.status, 201);
        assert.equal(retry.headers.get("idempotent-replayed"), "true");
        assert.equal(await retry.text(), body);
        assert.equal(state.count, 1);
        // The error still reaches the app's error handling (its answer goes nowhere).
        assert.equal(state.errors.length, errors);
      } finally {
        await server.close();
      }
    });
  }
});

describe("idem/express: replays replace the headers earlier middleware set (IDEM-REPLAY-4)", () => {
  test("a replay carries each stored header once, as the first answer did; a refusal keeps CORS", async () => {
    const { state, app } = makeApp({
      before: (app) =>
        app.use((req, res, next) => {
          res.set({ "access-control-allow-origin": "*", vary: "Origin" });
          next();
        }),
      routes: (app, state) => {
        app.use(express.json());
        app.post("/api/orders", (req, res) => {
          const id = ++state.count;
          res.cookie("order", String(id)).cookie("session", "s1").status(201).set("x-order-id", String(id)).json({ id });
        });
      },
    });
    const server = await listen(app);
    try {
      const key = fresh();
      const first = await post(server.url, { key });
      assert.equal(first.status, 201);
      const retry = await post(server.url, { key });
      assert.equal(retry.headers.get("idempotent-replayed"), "true");
      assert.equal(retry.headers.get("access-control-allow-origin"), "*");
      const own = new Set(["date", "connection", "keep-alive", "idempotent-replayed"]);
      const fields = (r) => [...r.headers].filter(([name]) => !own.has(name));
      assert.deepEqual(fields(retry), fields(first));
      assert.deepEqual(retry.headers.getSetCookie(), ["order=1; Path=/", "session=s1; Path=/"]);
      assert.equal(await retry.text(), await first.text());
      // The engine's own refusal keeps what earlier middleware set, once.
      const mismatch = await post(server.url, { key, body: '{"amount":1,"currency":"eur"}' });
      assert.equal(mismatch.status, 422);
      assert.equal(mismatch.headers.get("access-control-allow-origin"), "*");
      assert.equal(mismatch.headers.get("content-type"), "application/problem+json");
      assert.equal(state.count, 1);
    } finally {
      await server.close();
    }
  });
});

describe("idem/express: headers set before it are the request's, never stored (IDEM-JS-7)", () => {
  test("a replay to another origin carries that origin's CORS header and its own request id, not the first request's", async () => {
    const { state, app } = makeApp({
      before: (app) =>
        app.use((req, res, next) => {
          res.set({ "access-control-allow-origin": req.get("origin") ?? "", "x-request-id": req.get("x-request-id") ?? "" });
          next();
        }),
      routes: (app, state) => {
        app.post("/api/orders", (req, res) => {
          const id = ++state.count;
          res.status(201).set("x-order-id", String(id)).json({ id });
        });
      },
    });
    const server = await listen(app);
    const send = (key, origin, id) =>
      fetch(`${server.url}/api/orders`, { method: "POST", headers: { "content-type": "application/json", "idempotency-key": key, origin, "x-request-id": id }, body: ORDER });
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
      assert.equal(state.count, 1);
    } finally {
      await server.close();
    }
  });
});

describe("idem/express: cookies set before it stay beside the answer's (IDEM-JS-7, IDEM-REPLAY-4)", () => {
  test("a session cookie set before the handler and the handler's own cookie both reach the client, first and on replay; a cookie of the same name is the handler's", async () => {
    const { state, app } = makeApp({
      before: (app) =>
        app.use((req, res, next) => {
          res.cookie("sid", req.get("x-session") ?? "none");
          res.cookie("theme", "light");
          next();
        }),
      routes: (app, state) => {
        app.post("/api/orders", (req, res) => {
          const id = ++state.count;
          res.cookie("last_order", String(id));
          res.cookie("theme", "dark");
          res.status(201).json({ id });
        });
      },
    });
    const server = await listen(app);
    const send = (key, session) =>
      fetch(`${server.url}/api/orders`, { method: "POST", headers: { "content-type": "application/json", "idempotency-key": key, "x-session": session }, body: ORDER });
    const names = (response) => response.headers.getSetCookie().map((c) => c.split(";")[0]);
    try {
      const key = fresh();
      const first = await send(key, "s1");
      assert.equal(first.status, 201);
      assert.deepEqual(names(first).sort(), ["last_order=1", "sid=s1", "theme=dark"]);
      const retry = await send(key, "s2");
      assert.equal(retry.headers.get("idempotent-replayed"), "true");
      assert.deepEqual(names(retry).sort(), ["last_order=1", "sid=s2", "theme=dark"]);
      assert.equal(state.count, 1);
    } finally {
      await server.close();
    }
  });
});

describe("idem/express: a body read before the adapter is refused (IDEM-JS-6)", () => {
  const parsers = [
    ["express.json()", express.json(), "application/json", ORDER, '{"amount":1,"currency":"eur"}'],
    ["express.urlencoded()", express.urlencoded(), "application/x-www-form-urlencoded", "amount=4200&currency=eur", "amount=1&currency=eur"],
    ["express.text()", express.text(), "text/plain", "amount 4200 eur", "amount 1 eur"],
    ["express.raw()", express.raw(), "application/octet-stream", "\x01\x02\x03", "\x09"],
  ];
  for (const [name, parser, contentType, body, other] of parsers) {
    test(`${name} mounted first: a configuration error, nothing claimed or executed (IDEM-FP-1)`, async () => {
      const { state, app } = makeApp({
        before: (app) => app.use(parser),
        routes: (app, state) => app.post("/api/orders", (req, res) => res.status(201).json({ id: ++state.count })),
      });
      const server = await listen(app);
      try {
        const key = fresh();
        for (const payload of [body, other, body]) {
          const r = await post(server.url, { key, body: payload, contentType });
          assert.equal(r.status, 500);
          const answer = await r.json();
          assert.equal(answer.code, "IDEM-JS-6");
          assert.match(answer.error, /before|body parser/i);
        }
        assert.equal(state.count, 0, "nothing executed");
        assert.equal(state.errors.length, 3);
      } finally {
        await server.close();
      }
    });
  }

  test("a parser mounted first that leaves the body unread (another content type) changes nothing", async () => {
    const { state, app } = makeApp({
      before: (app) => app.use(express.json()),
      routes: (app, state) =>
        app.post("/api/orders", (req, res) => res.status(201).json({ id: ++state.count, raw: Buffer.from(req.rawBody).toString() })),
    });
    const server = await listen(app);
    try {
      const key = fresh();
      const first = await post(server.url, { key, body: "amount 4200 eur", contentType: "text/plain" });
      assert.equal(first.status, 201);
      assert.deepEqual(await first.json(), { id: 1, raw: "amount 4200 eur" });
      const mismatch = await post(server.url, { key, body: "amount 1 eur", contentType: "text/plain" });
      assert.equal(mismatch.status, 422);
      assert.equal(state.count, 1);
    } finally {
      await server.close();
    }
  });
});

describe("idem/express: a body that is not JSON stays in the request for the parsers after it (IDEM-JS-11)", () => {
  const form = (fields) => {
    const data = new FormData();
    for (const [name, value] of Object.entries(fields)) data.append(name, new Blob([value]), `${name}.txt`);
    return data;
  };
  // Each: the parser after the adapter, the body and another payload, and what the route
  // answers with what the parser made of it.
  const kinds = [
    ["express.urlencoded()", express.urlencoded({ extended: false }), "application/x-www-form-urlencoded", "amount=4200&currency=eur", "amount=1&currency=eur", (req) => ({ ...req.body })],
    ["express.text()", express.text(), "text/plain", "amount 4200 eur", "amount 1 eur", (req) => req.body],
    ["express.raw()", express.raw(), "application/octet-stream", "\x01\x02\x03", "\x09", (req) => [...req.body]],
    ["multer (multipart)", multer({ storage: multer.memoryStorage() }).any(), undefined, () => form({ invoice: "x".repeat(200) }), () => form({ invoice: "y".repeat(200) }), (req) => req.files.map((f) => [f.fieldname, f.size])],
    ["the route reading the stream itself", (req, res, next) => next(), "application/octet-stream", "b".repeat(900), "c".repeat(900), async (req) => {
      let size = 0;
      for await (const chunk of req) size += chunk.byteLength;
      return size;
    }],
  ];
  for (const [name, parser, contentType, body, other, read] of kinds) {
    test(`${name}: the route gets the body; a retry is replayed, another payload refused`, async () => {
      const { state, app } = makeApp({
        routes: (app, state) =>
          app.post("/api/orders", parser, async (req, res) => res.status(201).json({ id: ++state.count, got: await read(req), raw: req.rawBody.byteLength })),
        fingerprint: { maxBody: 1024 },
      });
      const server = await listen(app);
      try {
        const key = fresh();
        const send = (payload) => {
          const init = { method: "POST", headers: { "idempotency-key": key }, body: typeof payload === "function" ? payload() : payload, signal: AbortSignal.timeout(5_000) };
          if (contentType !== undefined) init.headers["content-type"] = contentType;
          return fetch(`${server.url}/api/orders`, init);
        };
        const first = await send(body);
        assert.equal(first.status, 201);
        const answer = await first.json();
        const expected = { "express.urlencoded()": { amount: "4200", currency: "eur" }, "express.text()": "amount 4200 eur", "express.raw()": [1, 2, 3], "multer (multipart)": [["invoice", 200]] }[name] ?? 900;
        assert.deepEqual(answer.got, expected, "the parser after the adapter read the body");
        assert.ok(answer.raw > 0, "and the adapter kept the bytes it fingerprinted");
        if (typeof body !== "function") {
          // (A multipart body's boundary differs on every send: the same form is another payload.)
          const retry = await send(body);
          assert.equal(retry.headers.get("idempotent-replayed"), "true");
          assert.deepEqual(await retry.json(), answer);
        }
        const mismatch = await send(other);
        assert.equal(mismatch.status, 422);
        assert.equal(state.count, 1, "one run");
      } finally {
        await server.close();
      }
    });
  }

  test("past the limit: 413, nothing claimed or executed, and the connection closes (IDEM-LIMIT-1)", async () => {
    const { state, app } = makeApp({
      routes: (app, state) => app.post("/api/orders", express.raw({ limit: "1mb" }), (req, res) => res.status(201).json({ id: ++state.count })),
      fingerprint: { maxBody: 1024 },
    });
    const server = await listen(app);
    try {
      const key = fresh();
      // No declared length: the body is read until it passes the limit.
      const body = new ReadableStream({
        start(controller) {
          for (let i = 0; i < 8; i++) controller.enqueue(new Uint8Array(512).fill(7));
          controller.close();
        },
      });
      const r = await fetch(`${server.url}/api/orders`, { method: "POST", headers: { "idempotency-key": key, "content-type": "application/octet-stream" }, body, duplex: "half", signal: AbortSignal.timeout(5_000) });
      assert.equal(r.status, 413);
      assert.equal(r.headers.get("content-type"), "application/problem+json");
      assert.equal((await r.json()).type, "urn:idem:problem:body-too-large");
      const small = await fetch(`${server.url}/api/orders`, { method: "POST", headers: { "idempotency-key": key, "content-type": "application/octet-stream" }, body: "ok", signal: AbortSignal.timeout(5_000) });
      assert.equal(small.status, 201, "the key was never claimed");
      assert.equal(state.count, 1);
    } finally {
      await server.close();
    }
  });
});
