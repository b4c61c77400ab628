// What `idem/express` holds back of an Express app's answer and sends (js/node-response.js),
// over loopback HTTP, against what the same app sends without idem: the first answer is the
// app's and the replay is the first answer (IDEM-JS-7), a response that closes before the
// app ends it is an unknown outcome when the app destroyed it, so a retry runs again instead
// of being held (IDEM-JS-7, IDEM-OUT-3), while a client that went away leaves the app's
// answer to be stored for its retry, and nothing the app does after its answer ends the
// process.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { request as httpRequest } from "node:http";
import { connect } from "node:net";
import { Readable } from "node:stream";
import { test } from "node:test";
import express from "express";
import { MemoryStore } from "idem";
import { idempotency } from "idem/express";
import { checkEndlessAnswer, endlessSource } from "./framework-http.mjs";

const key = () => `"${randomUUID()}"`;
const ticks = async (n) => {
  for (let i = 0; i < n; i++) await null;
};

/** Runs `check(url, state)` against an app with the adapter on /api and `routes(app, state)`,
 * its errors answered with 500 `{ error }`; the server is closed afterwards. */
async function withApp(routes, check, options = {}) {
  const state = { runs: 0, errors: [] };
  const app = express();
  app.use("/api", idempotency({ store: new MemoryStore(), principal: "none", ...options }));
  routes(app, state);
  app.use((err, req, res, next) => {
    state.errors.push(err);
    state.headersSent = res.headersSent;
    if (res.headersSent) return next(err);
    res.status(500).json({ error: err.message });
  });
  const server = await new Promise((resolve) => {
    const s = app.listen(0, "127.0.0.1", () => resolve(s));
  });
  try {
    await check(`http://127.0.0.1:${server.address().port}`, state);
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
}

/** A POST to `path` of `url` that accepts trailers: its status, body, and trailers. */
function withTrailers(url, k, path = "/api/orders") {
  return new Promise((resolve, reject) => {
    const headers = { "idempotency-key": k, "content-type": "application/json", te: "trailers", "x-user": "alice" };
    const req = httpRequest(`${url}${path}`, { method: "POST", headers }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (d) => (body += d));
      res.on("end", () => resolve({ status: res.statusCode, body, trailers: res.trailers }));
    });
    req.on("error", reject);
    req.end('{"amount":1}');
  });
}

const post = (url, k, path = "/api/orders", signal = AbortSignal.timeout(5_000)) =>
  fetch(`${url}${path}`, {
    method: "POST",
    headers: { "idempotency-key": k, "content-type": "application/json" },
    body: '{"amount":1}',
    signal,
  });

test("a response the app destroys before it ends: the client's request fails, and a retry runs again instead of waiting on the key", async () => {
  await withApp(
    (app, state) =>
      app.post("/api/orders", (req, res) => {
        state.runs++;
        if (state.runs === 1) return res.destroy();
        res.status(201).json({ run: state.runs });
      }),
    async (url, state) => {
      const k = key();
      await assert.rejects(post(url, k));
      const retry = await post(url, k);
      assert.equal(retry.status, 201);
      assert.deepEqual(await retry.json(), { run: 2 });
      assert.equal(state.runs, 2);
      assert.deepEqual(state.errors, [], "a response gone has no one to answer");
    },
  );
});

test("a client that goes away while the app works: the app's answer is stored, its retry finds the key in flight and then the replay, and the app ran once (IDEM-JS-7, IDEM-EXEC-1)", async () => {
  let finish;
  const working = new Promise((resolve) => (finish = resolve));
  await withApp(
    (app, state) =>
      app.post("/api/orders", async (req, res) => {
        const run = ++state.runs;
        await working;
        state.charged = (state.charged ?? 0) + 1;
        res.status(201).json({ run });
      }),
    async (url, state) => {
      const k = key();
      // The client gives up before the app answers (a timeout), and retries at once.
      const first = new AbortController();
      const gone = post(url, k, "/api/orders", first.signal);
      while (state.runs === 0) await new Promise((resolve) => setTimeout(resolve, 5));
      first.abort();
      await assert.rejects(gone);
      await new Promise((resolve) => setTimeout(resolve, 50));
      const retry = await post(url, k);
      assert.equal(retry.status, 409, "the retry ran beside the app");
      assert.equal(state.runs, 1);
      finish();
      let replay;
      for (let i = 0; i < 100; i++) {
        replay = await post(url, k);
        if (replay.status !== 409) break;
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      assert.equal(replay.status, 201);
      assert.equal(replay.headers.get("idempotent-replayed"), "true");
      assert.deepEqual(await replay.json(), { run: 1 });
      assert.equal(state.charged, 1);
      assert.deepEqual(state.errors, []);
    },
  );
});

test("writes after the answer go nowhere, however late, and never end the process", async () => {
  await withApp(
    (app, state) =>
      app.post("/api/orders", async (req, res) => {
        state.runs++;
        res.status(201).json({ run: state.runs });
        for (let n = 0; n < 40; n++) {
          await ticks(1);
          res.write("late");
        }
      }),
    async (url) => {
      const k = key();
      const first = await post(url, k);
      assert.equal(first.status, 201);
      assert.deepEqual(await first.json(), { run: 1 });
      await new Promise((resolve) => setTimeout(resolve, 50));
      const replay = await post(url, k);
      assert.deepEqual(await replay.json(), { run: 1 });
      assert.equal(replay.headers.get("idempotent-replayed"), "true");
    },
  );
});

test("a handler that throws just after its answer: the client gets the answer that is stored and replayed", async () => {
  await withApp(
    (app, state) =>
      app.post("/api/orders/:ticks", async (req, res) => {
        state.runs++;
        res.status(201).json({ run: state.runs });
        await ticks(Number(req.params.ticks));
        throw new Error("late failure");
      }),
    async (url, state) => {
      // However many steps after its answer it throws.
      for (let n = 0; n <= 12; n++) {
        const k = key();
        const first = await post(url, k, `/api/orders/${n}`);
        const firstBody = await first.json();
        const replay = await post(url, k, `/api/orders/${n}`);
        assert.equal(first.status, 201, `throwing ${n} steps after: ${JSON.stringify(firstBody)}`);
        assert.equal(replay.status, 201);
        assert.deepEqual(await replay.json(), firstBody);
      }
      assert.equal(state.runs, 13);
    },
  );
});

test("an answer the app begins and then never ends is let go when the lease ends: the core's 500 problem, its later writes go nowhere, and the retry runs again (IDEM-OUT-7)", async () => {
  await withApp(
    (app, state) =>
      app.post("/api/orders", (req, res) => {
        state.runs++;
        if (state.runs > 1) return res.status(201).json({ run: state.runs });
        res.status(201).setHeader("x-app", "first");
        res.statusMessage = "Order Taken";
        res.write("partial ");
        // It wakes after the engine answered: what it writes goes nowhere.
        setTimeout(() => res.end("late"), 1_500);
      }),
    async (url, state) => {
      const k = key();
      const since = Date.now();
      const first = await post(url, k);
      assert.ok(Date.now() - since >= 1_000, "not before the lease ends");
      assert.equal(first.status, 500);
      assert.equal(first.headers.get("content-type"), "application/problem+json");
      assert.equal(first.headers.get("x-app"), null, "none of the app's head");
      assert.equal(first.statusText, "Internal Server Error", "nor its reason phrase");
      const problem = await first.json();
      assert.equal(problem.type, "about:blank");
      assert.equal(problem.detail, "the response body was not read whole before the lease ended");
      const retry = await post(url, k);
      assert.equal(retry.status, 201);
      assert.deepEqual(await retry.json(), { run: 2 });
      await new Promise((resolve) => setTimeout(resolve, 700));
      assert.equal(state.errors.length, 0, "the late end is nobody's error");
    },
    { lease: 1_000 },
  );
});

test("an app that writes and then throws: no part of its answer is stored, and the retry runs again (IDEM-OUT-3)", async () => {
  await withApp(
    (app, state) =>
      app.post("/api/orders", (req, res) => {
        state.runs++;
        if (state.runs > 1) return res.status(201).json({ run: state.runs });
        res.status(201);
        res.write('{"partial":');
        throw new Error("failed half-way");
      }),
    async (url, state) => {
      const k = key();
      // The error handler's answer (500) after the partial body: an unknown outcome, never
      // the partial 201 kept as a success.
      const first = await post(url, k);
      assert.equal(first.status, 500);
      await first.text();
      const retry = await post(url, k);
      assert.equal(retry.status, 201);
      assert.equal(retry.headers.get("idempotent-replayed"), null);
      assert.deepEqual(await retry.json(), { run: 2 });
    },
  );
});

test("a status Node refuses is the app's error, answered by its error handling, and the key is not held", async () => {
  await withApp(
    (app, state) =>
      app.post("/api/orders", (req, res) => {
        state.runs++;
        res.statusCode = 1000;
        res.end();
      }),
    async (url, state) => {
      const k = key();
      const first = await post(url, k);
      assert.equal(first.status, 500);
      assert.match((await first.json()).error, /Invalid status code/);
      assert.equal(state.errors[0]?.code, "ERR_HTTP_INVALID_STATUS_CODE");
      const retry = await post(url, k);
      assert.notEqual(retry.status, 409);
    },
  );
});

test("a chunk that is not text or bytes is refused as Node refuses it", async () => {
  await withApp(
    (app) =>
      app.post("/api/orders", (req, res) => {
        res.end(new Uint16Array([0x4142, 0x4344]));
      }),
    async (url, state) => {
      const first = await post(url, key());
      assert.equal(first.status, 500);
      assert.equal(state.errors[0]?.code, "ERR_INVALID_ARG_TYPE");
    },
  );
});

test("headers set when the head is written (on-headers, mounted after the adapter) and repeated raw headers are in the answer and its replay", async () => {
  await withApp(
    (app) => {
      // What on-headers does for express-session and response-time: a field set when the
      // head is written.
      app.use((req, res, next) => {
        const writeHead = res.writeHead;
        res.writeHead = function (...args) {
          res.setHeader("x-at-head", "1");
          return writeHead.apply(this, args);
        };
        next();
      });
      app.post("/api/orders", (req, res) => {
        res.status(201).json({ ok: true });
      });
      app.post("/api/cookies", (req, res) => {
        res.writeHead(201, ["set-cookie", "a=1", "set-cookie", "b=2", "content-type", "text/plain"]);
        res.end("ok");
      });
    },
    async (url) => {
      const k = key();
      for (const response of [await post(url, k), await post(url, k)]) {
        assert.equal(response.status, 201);
        assert.equal(response.headers.get("x-at-head"), "1");
      }
      const c = key();
      for (const response of [await post(url, c, "/api/cookies"), await post(url, c, "/api/cookies")]) {
        assert.equal(response.status, 201);
        assert.deepEqual(response.headers.getSetCookie(), ["a=1", "b=2"]);
      }
    },
  );
});

test("an answer with trailer fields goes out with them, and a retry learns it was not stored (IDEM-STORE-5)", async () => {
  await withApp(
    (app, state) =>
      app.post("/api/orders", (req, res) => {
        state.runs++;
        res.status(201).setHeader("trailer", "x-checksum");
        res.write("body");
        res.addTrailers({ "x-checksum": "abc" });
        res.end();
      }),
    async (url, state) => {
      const k = key();
      const first = await withTrailers(url, k);
      assert.equal(first.status, 201);
      assert.equal(first.body, "body");
      assert.deepEqual(first.trailers, { "x-checksum": "abc" });
      const retry = await withTrailers(url, k);
      assert.equal(retry.status, 410);
      const problem = JSON.parse(retry.body);
      assert.equal(problem.type, "urn:idem:problem:response-not-stored");
      assert.match(problem.detail, /trailer fields/);
      assert.equal(state.runs, 1);
    },
  );
});

test("a custom reason phrase reaches the client on the first answer", async () => {
  await withApp(
    (app) =>
      app.post("/api/orders", (req, res) => {
        res.writeHead(201, "Order Taken", { "content-type": "text/plain" });
        res.end("ok");
      }),
    async (url) => {
      const line = await new Promise((resolve, reject) => {
        const socket = connect(new URL(url).port, "127.0.0.1", () =>
          socket.write(`POST /api/orders HTTP/1.1\r\nhost: x\r\nidempotency-key: ${key()}\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}`),
        );
        let got = "";
        socket.on("data", (d) => (got += d));
        socket.on("end", () => resolve(got.split("\r\n")[0]));
        socket.on("error", reject);
      });
      assert.equal(line, "HTTP/1.1 201 Order Taken");
    },
  );
});

test("a body longer than the store keeps goes out whole as the app writes it, and a retry learns it was not stored (IDEM-STORE-5)", async () => {
  await withApp(
    (app, state) => {
      app.post("/api/orders", (req, res) => {
        state.runs++;
        res.status(201).type("text/plain");
        Readable.from((function* () {
          for (let i = 0; i < 50; i++) yield Buffer.alloc(100, 48 + (i % 10));
        })()).pipe(res);
      });
      app.post("/api/whole", (req, res) => {
        state.runs++;
        res.status(201).send(Buffer.alloc(5_000, "y"));
      });
    },
    async (url, state) => {
      for (const path of ["/api/orders", "/api/whole"]) {
        const k = key();
        const first = await post(url, k, path);
        assert.equal(first.status, 201);
        const body = await first.text();
        assert.equal(body.length, 5_000, path);
        if (path === "/api/whole") assert.equal(first.headers.get("content-length"), "5000");
        else assert.equal(body.slice(4_900), "9".repeat(100));
        const retry = await post(url, k, path);
        assert.equal(retry.status, 410);
        assert.equal((await retry.json()).type, "urn:idem:problem:response-not-stored");
      }
      assert.equal(state.runs, 2, "neither runs again");
      assert.deepEqual(state.errors, []);
    },
    { maxResponseBytes: 1_000 },
  );
});

test("past the store's limit the head is the app's as it was then: an error after the answer leaves it whole, one before its end takes the path of a head already sent (IDEM-STORE-5)", async () => {
  await withApp(
    (app, state) => {
      app.post("/api/answered", (req, res) => {
        state.runs++;
        res.status(201).send(Buffer.alloc(5_000, "y"));
        throw new Error("after the answer");
      });
      app.post("/api/unfinished", (req, res) => {
        state.runs++;
        res.status(200).type("text/plain");
        res.write(Buffer.alloc(5_000, "z"));
        throw new Error("before the end");
      });
    },
    async (url, state) => {
      const k = key();
      const first = await post(url, k, "/api/answered");
      assert.equal(first.status, 201, "the error handler's 500 is not the head");
      assert.equal(first.headers.get("content-length"), "5000");
      assert.equal(await first.text(), "y".repeat(5_000));
      assert.equal(state.headersSent, false, "the answer was whole: the handler could answer, and went nowhere");
      // Express's final handler closes the connection of an answer whose head went out
      // before an error, as it does without idem.
      const broken = await post(url, key(), "/api/unfinished").then((r) => r.text()).then(
        (text) => ({ text }),
        (err) => ({ err }),
      );
      assert.ok(broken.err !== undefined, `an unfinished answer is cut, not completed: ${broken.text?.length} bytes`);
      assert.equal(state.headersSent, true, "the head counted as sent");
      const retry = await post(url, k, "/api/answered");
      assert.equal(retry.status, 410);
      assert.equal(state.runs, 2);
    },
    { maxResponseBytes: 1_000 },
  );
});

test("a wrapper mounted after the adapter that calls the methods it took a tick later still sends the whole answer past the store's limit (IDEM-STORE-5)", async () => {
  await withApp(
    (app, state) => {
      app.use("/api", (req, res, next) => {
        // As a compressor does: the methods it found (the adapter's), called later.
        const { write, end } = res;
        res.write = (chunk, encoding, callback) => {
          setImmediate(() => write.call(res, chunk, encoding, callback));
          return true;
        };
        res.end = (chunk, encoding, callback) => {
          setImmediate(() => end.call(res, chunk, encoding, callback));
          return res;
        };
        next();
      });
      app.post("/api/orders", (req, res) => {
        state.runs++;
        res.status(201).type("text/plain");
        for (let i = 0; i < 50; i++) res.write(Buffer.alloc(100, 48 + (i % 10)));
        res.end();
      });
    },
    async (url, state) => {
      const first = await post(url, key());
      assert.equal(first.status, 201);
      const body = await first.text();
      assert.equal(body.length, 5_000);
      assert.equal(body.slice(4_900), "9".repeat(100));
      assert.equal(state.runs, 1);
    },
    { maxResponseBytes: 1_000 },
  );
});

test("a response that never ends is sent at the pace the client reads it, not held until it ends (IDEM-STORE-5)", async () => {
  await withApp(
    (app, state) =>
      app.post("/api/orders", (req, res) => {
        const source = endlessSource(state);
        res.once("close", () => {
          state.closed = true;
          source.destroy();
        });
        res.status(200).type("application/octet-stream");
        source.pipe(res);
      }),
    (url, state) => checkEndlessAnswer(new URL(url).port, "/api/orders", state),
    { maxResponseBytes: 64 << 10 },
  );
});
