// Bad input through the worker: every refusal is application/problem+json with a stable type,
// and nothing runs (the count oracle does not move). Keys (IDEM-KEY-1, IDEM-KEY-3,
// IDEM-KEY-5), bodies that are not JSON (IDEM-FP-6), bodies over the limit (IDEM-LIMIT-1),
// and requests the example itself refuses. A refused request does not use up its key.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { count, post, rawRequest, startWorker } from "./runtime.mjs";

const MAX_BODY = 1024;
let worker;

before(async () => {
  worker = await startWorker({ vars: { IDEM_MAX_BODY_BYTES: String(MAX_BODY) } });
});

after(async () => {
  await worker?.dispose();
});

const ORDER = '{"amount":4200,"currency":"eur"}';
const fresh = () => `"${randomUUID()}"`;

/** Sends with `send()`, checks a problem+json answer of `status` and `type`, and that the
 * count oracle did not move. Returns the problem. */
async function refused(send, status, type) {
  const before = await count(worker.url);
  const r = await send();
  const text = typeof r.text === "function" ? await r.text() : r.body;
  const contentType = typeof r.headers.get === "function" ? r.headers.get("content-type") : r.headers["content-type"];
  assert.equal(r.status, status, text);
  assert.equal(contentType, "application/problem+json", text);
  const problem = JSON.parse(text);
  assert.equal(problem.type, type, text);
  assert.equal(problem.status, status);
  assert.equal(typeof problem.title, "string");
  assert.equal(await count(worker.url), before, "nothing executed");
  return problem;
}

/** The key was not used up by the refusal: a good request with it executes. */
async function keyStillFresh(key) {
  const before = await count(worker.url);
  const r = await post(worker.url, { key });
  assert.equal(r.status, 201, await r.text());
  assert.equal(r.headers.get("idempotent-replayed"), null);
  assert.equal(await count(worker.url), before + 1);
}

test("oversized keys are refused with 400 malformed-key (IDEM-KEY-6)", async () => {
  const bare = "k".repeat(256);
  await refused(() => post(worker.url, { key: bare }), 400, "urn:idem:problem:malformed-key");
  await refused(() => post(worker.url, { key: `"${bare}"` }), 400, "urn:idem:problem:malformed-key");
  await refused(() => post(worker.url, { key: `"${"k".repeat(64 * 1024)}"` }), 400, "urn:idem:problem:malformed-key");
  // The boundary: 255 characters is a key.
  const r = await post(worker.url, { key: `"${"k".repeat(255)}"` });
  assert.equal(r.status, 201);
  await r.arrayBuffer();
});

test("malformed sf-strings and bad key bytes are refused with 400 malformed-key (IDEM-KEY-1)", async () => {
  const malformed = [
    '"unterminated',
    '"bad\\escape"',
    '"trailing"junk',
    '""extra"',
    '"two", "keys"',
    'white space',
    '"tab\there"',
  ];
  for (const key of malformed) {
    const problem = await refused(
      () => rawRequest(worker.url, { head: ["authorization: Bearer a", "content-type: application/json", `idempotency-key: ${key}`], body: ORDER }),
      400,
      "urn:idem:problem:malformed-key",
    );
    assert.ok(problem.detail.length > 0, `a detail for ${JSON.stringify(key)}`);
  }
  // Bytes outside visible ASCII, written raw (Fetch would refuse to send them).
  for (const bytes of [[0x22, 0xc3, 0xa9, 0x22], [0x22, 0x01, 0x22], [0x22, 0x7f, 0x22]]) {
    await refused(
      () =>
        rawRequest(worker.url, {
          head: ["authorization: Bearer a", "content-type: application/json", `idempotency-key: ${Buffer.from(bytes).toString("latin1")}`],
          body: ORDER,
        }),
      400,
      "urn:idem:problem:malformed-key",
    );
  }
});

test("missing, empty and repeated keys are refused with 400 (IDEM-KEY-3, IDEM-KEY-5)", async () => {
  await refused(() => post(worker.url, {}), 400, "urn:idem:problem:missing-key");
  await refused(() => post(worker.url, { key: "" }), 400, "urn:idem:problem:missing-key");
  await refused(() => post(worker.url, { key: '""' }), 400, "urn:idem:problem:missing-key");
  const key = fresh();
  await refused(
    () =>
      rawRequest(worker.url, {
        head: ["authorization: Bearer a", "content-type: application/json", `idempotency-key: ${key}`, `idempotency-key: ${fresh()}`],
        body: ORDER,
      }),
    400,
    "urn:idem:problem:malformed-key",
  );
  await keyStillFresh(key);
});

test("invalid JSON is refused with 400 invalid-json before the key is claimed (IDEM-FP-6)", async () => {
  const key = fresh();
  for (const body of ['{"amount":', "{'amount':1}", '{"amount":1}}', "\xff\xfe", "", "NaN"]) {
    await refused(() => post(worker.url, { key, body }), 400, "urn:idem:problem:invalid-json");
  }
  await keyStillFresh(key);
});

test("bodies over the limit are refused with 413 body-too-large, declared or streamed (IDEM-LIMIT-1)", async () => {
  const key = fresh();
  const big = JSON.stringify({ amount: 1, note: "x".repeat(MAX_BODY) });
  // Declared by Content-Length: refused before the body is read.
  await refused(() => post(worker.url, { key, body: big }), 413, "urn:idem:problem:body-too-large");
  await refused(
    () => rawRequest(worker.url, { head: ["authorization: Bearer a", "content-type: application/json", `idempotency-key: ${key}`], body: "x".repeat(10 * MAX_BODY) }),
    413,
    "urn:idem:problem:body-too-large",
  );
  // Streamed without a length (chunked): refused once read.
  await refused(
    () =>
      fetch(`${worker.url}/orders`, {
        method: "POST",
        headers: { authorization: "Bearer a", "content-type": "application/json", "idempotency-key": key },
        body: new Blob([big]).stream(),
        duplex: "half",
        signal: AbortSignal.timeout(10_000),
      }),
    413,
    "urn:idem:problem:body-too-large",
  );
  // The limit itself is a body.
  const fits = JSON.stringify({ amount: 1, note: "x".repeat(MAX_BODY - 22) });
  assert.equal(Buffer.byteLength(fits), MAX_BODY);
  const r = await post(worker.url, { key, body: fits });
  assert.equal(r.status, 201, await r.text());
});

test("orders that are not JSON objects are refused by the handler, stored, and never run the side effect", async () => {
  for (const [body, contentType, status, type] of [
    ["[1,2,3]", "application/json", 400, "urn:idem-example:problem:invalid-order"],
    ['"an order"', "application/json", 400, "urn:idem-example:problem:invalid-order"],
    ["null", "application/json", 400, "urn:idem-example:problem:invalid-order"],
    ["amount=4200", "application/x-www-form-urlencoded", 415, "urn:idem-example:problem:unsupported-media-type"],
  ]) {
    const key = fresh();
    const send = () => post(worker.url, { key, body, headers: { "content-type": contentType } });
    const problem = await refused(send, status, type);
    // A deterministic 4xx is final: the retry replays it, and still nothing runs.
    const replay = await refused(send, status, type);
    assert.deepEqual(replay, problem);
  }
});

test("unknown routes and methods get the core's about:blank problems, and the benchmark routes are off by default", async () => {
  const wrongMethod = await refused(() => fetch(`${worker.url}/orders`, { signal: AbortSignal.timeout(10_000) }), 405, "about:blank");
  assert.equal(wrongMethod.title, "Method Not Allowed");
  const allow = await fetch(`${worker.url}/webhooks/payments`, { signal: AbortSignal.timeout(10_000) });
  assert.equal(allow.status, 405);
  assert.equal(allow.headers.get("allow"), "POST");
  await allow.arrayBuffer();
  await refused(() => post(worker.url, { key: fresh(), path: "/count" }), 405, "about:blank");
  const notFound = await refused(() => post(worker.url, { key: fresh(), path: "/refunds" }), 404, "about:blank");
  assert.deepEqual(notFound, { detail: "no route for /refunds", status: 404, title: "Not Found", type: "about:blank" });
  await refused(() => post(worker.url, { path: "/unprotected/orders" }), 404, "about:blank");
  await refused(() => post(worker.url, { path: "/unprotected/runs" }), 404, "about:blank");
});

test("a misconfigured worker answers 500 problem+json naming the variable, and runs nothing", async () => {
  for (const [vars, variable] of [
    [{ IDEM_LEASE_MS: "soon" }, "IDEM_LEASE_MS"],
    [{ IDEM_RESPONSE_TTL_MS: "5000", IDEM_KEY_TTL_MS: "1000" }, "IDEM_KEY_TTL_MS"],
    [{ IDEM_IN_FLIGHT: "wait" }, "IDEM_IN_FLIGHT"],
    // Kinds' bounds that do not fit the key retention: the engine's own error, not a clamp.
    [{ IDEM_RESPONSE_TTL_MS: "1000", IDEM_KEY_TTL_MS: "2000", IDEM_LEASE_MS: "500", IDEM_TIME_MAX_AGE_MS: "5000" }, "IDEM_TIME_MAX_AGE_MS.*key retention"],
    // A lease longer than the key retention is the shared settings' error, not a kind's.
    [{ IDEM_RESPONSE_TTL_MS: "1000", IDEM_KEY_TTL_MS: "2000" }, "^lease must not exceed key_ttl"],
    [{ IDEM_KEY_TTL_MS: "86400000", IDEM_TOKEN_SECRET: "ab".repeat(32), IDEM_TOKEN_TTL_MS: "86400001" }, "IDEM_TOKEN_TTL_MS.*key retention"],
  ]) {
    const bad = await startWorker({ vars });
    try {
      const r = await post(bad.url, { key: fresh() });
      assert.equal(r.status, 500);
      assert.equal(r.headers.get("content-type"), "application/problem+json");
      const problem = await r.json();
      assert.equal(problem.type, "urn:idem-example:problem:misconfigured");
      assert.match(problem.detail, new RegExp(variable));
      assert.equal(await count(bad.url), 0);
    } finally {
      await bad.dispose();
    }
  }
});
