// Bodies without a declared length, through the Fetch wrapper and the Express adapter, against
// the built package: one reader (js/body.js) for both, the limit and the 413 the engine's.
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { connect } from "node:net";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import express from "express";
import { MemoryStore, withIdempotency } from "idem";
import { idempotency } from "idem/express";
import { checkEndlessUpload } from "./framework-http.mjs";

test("a chunked body past the limit is refused with 413 after reading only up to the limit (IDEM-LIMIT-1)", async () => {
  let executions = 0;
  const handler = withIdempotency(
    async () => {
      executions++;
      return new Response("ok", { status: 201 });
    },
    { principal: "none", store: new MemoryStore(), fingerprint: { maxBody: 1024 } },
  );
  let pulled = 0;
  let cancelled = false;
  const endless = new ReadableStream({
    pull(controller) {
      pulled++;
      controller.enqueue(new Uint8Array(256));
    },
    cancel() {
      cancelled = true;
    },
  });
  const request = new Request("http://127.0.0.1/orders", {
    method: "POST",
    headers: { "idempotency-key": '"chunked-1"', "content-type": "application/octet-stream" },
    body: endless,
    duplex: "half",
  });
  const response = await handler(request);
  assert.equal(response.status, 413);
  assert.equal(response.headers.get("content-type"), "application/problem+json");
  assert.equal((await response.json()).type, "urn:idem:problem:body-too-large");
  assert.equal(executions, 0);
  assert.ok(cancelled, "the upload is cancelled");
  assert.ok(pulled <= 8, `read ${pulled} chunks of 256 bytes for a 1024-byte limit`);

  // A chunked body within the limit is read whole and executes.
  const small = new ReadableStream({
    start(controller) {
      controller.enqueue(new TextEncoder().encode("ab"));
      controller.enqueue(new TextEncoder().encode("cd"));
      controller.close();
    },
  });
  const ok = await handler(
    new Request("http://127.0.0.1/orders", {
      method: "POST",
      headers: { "idempotency-key": '"chunked-2"', "content-type": "application/octet-stream" },
      body: small,
      duplex: "half",
    }),
  );
  assert.equal(ok.status, 201);
  assert.equal(executions, 1);
});

test("an endless chunked upload to the Express adapter is answered 413 while it goes on, its connection then closed, and nothing runs (IDEM-LIMIT-1)", async () => {
  let executions = 0;
  const app = express();
  app.use(idempotency({ store: new MemoryStore(), principal: "none", fingerprint: { maxBody: 1024 } }));
  app.post("/orders", (req, res) => {
    executions++;
    res.status(201).send("ok");
  });
  const server = await new Promise((resolve) => {
    const s = app.listen(0, "127.0.0.1", () => resolve(s));
  });
  try {
    await checkEndlessUpload(server.address().port, "/orders");
    assert.equal(executions, 0);
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

test("a client that goes away mid-body: the Express adapter runs nothing and hands the error to the app, and serves on", async () => {
  let executions = 0;
  let failed = () => {};
  const app = express();
  app.use(idempotency({ store: new MemoryStore(), principal: "none" }));
  app.post("/orders", (req, res) => {
    executions++;
    res.status(201).send("ok");
  });
  app.use((err, req, res, next) => {
    failed(err);
    next(err);
  });
  const server = await new Promise((resolve) => {
    const s = app.listen(0, "127.0.0.1", () => resolve(s));
  });
  try {
    for (const framing of ["content-length: 100", "transfer-encoding: chunked"]) {
      const failure = new Promise((resolve) => (failed = resolve));
      const socket = connect(server.address().port, "127.0.0.1");
      await new Promise((resolve) => socket.on("connect", resolve));
      const part = framing.startsWith("content-length") ? "x".repeat(10) : `a\r\n${"x".repeat(10)}\r\n`;
      socket.write(`POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: "gone-1"\r\n${framing}\r\n\r\n${part}`);
      await new Promise((resolve) => setTimeout(resolve, 50));
      socket.destroy();
      const err = await Promise.race([failure, new Promise((_, reject) => setTimeout(() => reject(new Error(`${framing}: the request never ended`)), 5_000))]);
      assert.ok(err instanceof Error, framing);
    }
    assert.equal(executions, 0);
    // The key was never claimed: the whole request under it runs.
    const ok = await fetch(`http://127.0.0.1:${server.address().port}/orders`, {
      method: "POST",
      headers: { "idempotency-key": '"gone-1"', "content-type": "text/plain" },
      body: "x".repeat(100),
    });
    assert.equal(ok.status, 201);
    assert.equal(executions, 1);
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

test("the Express adapter reads a body that a middleware before it paused", async () => {
  let executions = 0;
  const app = express();
  app.use((req, res, next) => {
    req.pause();
    next();
  });
  app.use(idempotency({ store: new MemoryStore(), principal: "none" }));
  app.post("/orders", (req, res) => {
    executions++;
    res.status(201).json({ got: req.body });
  });
  const server = await new Promise((resolve) => {
    const s = app.listen(0, "127.0.0.1", () => resolve(s));
  });
  try {
    const response = await fetch(`http://127.0.0.1:${server.address().port}/orders`, {
      method: "POST",
      headers: { "idempotency-key": '"paused-1"', "content-type": "application/json" },
      body: JSON.stringify({ amount: 5 }),
      signal: AbortSignal.timeout(5_000),
    });
    assert.equal(response.status, 201);
    assert.deepEqual(await response.json(), { got: { amount: 5 } });
    assert.equal(executions, 1);
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

test("the Express adapter reads a body that a middleware before it gave an encoding, as its bytes", async () => {
  const bodies = [];
  const app = express();
  app.use((req, res, next) => {
    req.setEncoding("utf8");
    next();
  });
  app.use(idempotency({ store: new MemoryStore(), principal: "none", fingerprint: { maxBody: 64 } }));
  app.post("/orders", (req, res) => {
    bodies.push(req.body);
    res.status(201).json({ n: bodies.length });
  });
  const server = await new Promise((resolve) => {
    const s = app.listen(0, "127.0.0.1", () => resolve(s));
  });
  // The body in two writes, so that it arrives as two text chunks.
  const send = (key, parts) =>
    new Promise((resolve, reject) => {
      const socket = connect(server.address().port, "127.0.0.1");
      let got = "";
      socket.on("connect", () => {
        const length = parts.reduce((n, p) => n + Buffer.byteLength(p), 0);
        socket.write(`POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: "${key}"\r\ncontent-type: application/json\r\ncontent-length: ${length}\r\nconnection: close\r\n\r\n${parts[0]}`);
        setTimeout(() => socket.write(parts[1]), 30);
      });
      socket.on("data", (d) => (got += d));
      socket.on("end", () => resolve(got));
      socket.on("error", reject);
    });
  try {
    const first = await send("text-1", ['{"item":"caf', 'é","qty":2}']);
    assert.match(first, /^HTTP\/1\.1 201 /);
    assert.deepEqual(bodies, [{ item: "café", qty: 2 }]);
    // The same bytes under the key replay; other bytes are another payload.
    assert.match(await send("text-1", ['{"item":"ca', 'fé","qty":2}']), /^HTTP\/1\.1 201 [\s\S]*idempotent-replayed: true/i);
    assert.match(await send("text-1", ['{"item":"caf', 'é","qty":3}']), /^HTTP\/1\.1 422 /);
    // The limit counts the bytes, not the characters.
    assert.match(await send("text-2", [`"${"é".repeat(20)}`, `${"é".repeat(20)}"`]), /^HTTP\/1\.1 413 /);
    assert.equal(bodies.length, 1);
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

test("the adapters read bodies through one reader, and only the engine names the limit", () => {
  const js = join(resolve(dirname(fileURLToPath(import.meta.url)), ".."), "js");
  for (const file of readdirSync(js).filter((f) => f.endsWith(".js"))) {
    // The code, without its comments.
    const code = readFileSync(join(js, file), "utf8")
      .replace(/\/\*[\s\S]*?\*\//g, "")
      .replace(/^\s*\/\/.*$/gm, "");
    // `Idempotency#refuseBody` (server.js) is the engine's rule; body.js is its one caller.
    if (file !== "body.js" && file !== "server.js") {
      assert.doesNotMatch(code, /refuseBody\(/, `${file} checks a body's size itself: use readBody (body.js)`);
    }
    assert.doesNotMatch(code, /\b413\b|maxBody\s*[:=]\s*\d/, `${file} names a body limit or its status`);
  }
});
