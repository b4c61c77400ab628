// The key kinds through the worker under workerd: /payments (unix-time keys), /transfers
// (wrapping counters with sessions) and /checkout (tokens), each checked by the conformance
// suite's family for its kind with the count oracle; 600 sequential requests on 8-bit
// counters that wrap; bad input per kind: problem+json, nothing executed; and the webhook
// inbox: one event delivered 10 times, processed once.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { conformanceBinary, count, post, removeDir, runProcess, startWorker, tempDir } from "./runtime.mjs";

const VARS = {
  IDEM_RESPONSE_TTL_MS: "2000",
  IDEM_KEY_TTL_MS: "4000",
  IDEM_LEASE_MS: "1000",
  IDEM_TIME_MAX_AHEAD_MS: "500",
  IDEM_TIME_MAX_AGE_MS: "1500",
  IDEM_COUNTER_BITS: "8",
  IDEM_COUNTER_WINDOW: "4",
  IDEM_TOKEN_SECRET: randomBytes(32).toString("hex"),
  IDEM_TOKEN_TTL_MS: "1000",
};

let worker;

before(async () => {
  worker = await startWorker({ vars: VARS });
});

after(async () => {
  await worker?.dispose();
});

async function suite(kind, path, extra) {
  const dir = tempDir();
  try {
    const json = join(dir, "report.json");
    const args = ["run", `${worker.url}${path}`, "--key-kind", kind, "--count-url", "/count", "-H", "Authorization: Bearer kinds", "--profile", "idem", "--strict", "--json", json, "--quiet", ...extra];
    const result = await runProcess(conformanceBinary(), args, 120_000);
    assert.equal(result.code, 0, `${kind}: idem-conformance exited with ${result.code ?? result.signal}\n${result.stdout}\n${result.stderr}`);
    checkFamily(kind, JSON.parse(readFileSync(json, "utf8")));
  } finally {
    removeDir(dir);
  }
}

function checkFamily(kind, report) {
  const family = report.cases.filter((c) => c.section === kind);
  assert.ok(family.length >= 3, kind);
  for (const c of family) assert.equal(c.verdict, "pass", `${c.id}: ${c.reason ?? c.observed}`);
}

test("the suite's time family passes against /payments (IDEM-TIME-2, IDEM-TIME-3, IDEM-TIME-4)", async () => {
  await suite("time", "/payments", ["--time-skew", "0.5", "--time-max-age", "1.5"]);
});

test("the suite's counter family passes against /transfers, wrapping 8-bit counters (IDEM-CTR-2 to IDEM-CTR-9)", async () => {
  await suite("counter", "/transfers", ["--session-url", "/sessions", "--counter-bits", "8", "--counter-window", "4"]);
});

test("the suite's token family passes against /checkout (IDEM-TOKEN-2 to IDEM-TOKEN-4)", async () => {
  await suite("token", "/checkout", ["--token-url", "/idempotency-tokens", "--token-ttl", "1"]);
});

async function openSession(client, firstSeq = 0) {
  const r = await post(worker.url, { path: "/sessions", body: JSON.stringify({ client, firstSeq }) });
  assert.equal(r.status, 201, await r.clone().text());
  return (await r.json()).epoch;
}

test("600 sequential requests on 8-bit counters, the window advancing: none lost or doubled (IDEM-CTR-2)", async () => {
  const epoch = await openSession("wrap-600");
  const before = await count(worker.url);
  for (let i = 0; i < 600; i++) {
    const seq = i % 256;
    const headers = { "idempotency-low-water": String(seq) };
    const body = JSON.stringify({ amount: i, currency: "eur" });
    const r = await post(worker.url, { path: "/transfers", key: `wrap-600:${epoch}:${seq}`, body, headers });
    const text = await r.text();
    assert.equal(r.status, 201, `request ${i}: ${text}`);
    if (i % 50 === 0) {
      const again = await post(worker.url, { path: "/transfers", key: `wrap-600:${epoch}:${seq}`, body, headers });
      await again.arrayBuffer();
      assert.equal(again.headers.get("idempotent-replayed"), "true", `retry of ${i}`);
    }
  }
  assert.equal(await count(worker.url), before + 600);
});

/** A refusal: problem+json of `status` and `type`, and the count oracle did not move. */
async function refused(request, status, type) {
  const before = await count(worker.url);
  const r = await request;
  const text = await r.text();
  assert.equal(r.status, status, text);
  assert.equal(r.headers.get("content-type"), "application/problem+json", text);
  assert.equal(JSON.parse(text).type, `urn:idem:problem:${type}`, text);
  assert.equal(await count(worker.url), before, "nothing executed");
}

test("bad time keys: non-numeric, negative, far in the future, past the horizon (IDEM-TIME-1 to IDEM-TIME-3)", async () => {
  for (const key of ["soon", "-5", "c:1.5", "c:+7"]) await refused(post(worker.url, { path: "/payments", key }), 400, "malformed-key");
  await refused(post(worker.url, { path: "/payments", key: `c:${Date.now() + 60_000}` }), 400, "key-from-future");
  await refused(post(worker.url, { path: "/payments", key: `c:${Date.now() - 10_000}` }), 412, "key-stale");
});

test("bad counter keys: non-numeric, negative, beyond 8 bits, an epoch going backwards, no session (IDEM-CTR-1, IDEM-CTR-3, IDEM-CTR-4)", async () => {
  const first = await openSession("bad-ctr");
  for (const seq of ["x", "-1", "256"]) await refused(post(worker.url, { path: "/transfers", key: `bad-ctr:${first}:${seq}` }), 400, "malformed-key");
  const second = await openSession("bad-ctr", 3);
  assert.notEqual(second, first);
  await refused(post(worker.url, { path: "/transfers", key: `bad-ctr:${first}:3` }), 412, "stale-epoch");
  await refused(post(worker.url, { path: "/transfers", key: "never-opened:1:0" }), 412, "unknown-client");
  const session = await post(worker.url, { path: "/sessions", body: JSON.stringify({ client: "no spaces allowed" }) });
  assert.equal(session.status, 400, await session.text());
});

test("forged and invented tokens are refused (IDEM-TOKEN-3)", async () => {
  const issued = await post(worker.url, { path: "/idempotency-tokens", body: "{}" });
  assert.equal(issued.status, 201);
  const { token } = await issued.json();
  const forged = token.slice(0, -1) + (token.endsWith("0") ? "1" : "0");
  await refused(post(worker.url, { path: "/checkout", key: forged }), 400, "token-forged");
  await refused(post(worker.url, { path: "/checkout", key: `tok_${"f".repeat(64)}` }), 400, "token-forged");
  // Another account's token is forged in this account's scope.
  const other = await (await post(worker.url, { path: "/idempotency-tokens", body: "{}", headers: { authorization: "Bearer b" } })).json();
  await refused(post(worker.url, { path: "/checkout", key: other.token }), 400, "token-forged");
});

test("without IDEM_TOKEN_SECRET the token routes say so and nothing runs", async () => {
  const plain = await startWorker({ vars: { IDEM_TOKEN_SECRET: "" } });
  try {
    const r = await post(plain.url, { path: "/idempotency-tokens", body: "{}" });
    assert.equal(r.status, 500);
    assert.match(await r.text(), /IDEM_TOKEN_SECRET/);
  } finally {
    await plain.dispose();
  }
});

test("one webhook event delivered 5 times concurrently and 5 times later is processed once (IDEM-INBOX-1, IDEM-INBOX-2)", async () => {
  const event = JSON.stringify({ id: `evt_${randomBytes(6).toString("hex")}`, type: "payment.succeeded", amount: 4200 });
  const deliver = () => post(worker.url, { path: "/webhooks/payments", body: event });
  const before = await count(worker.url);
  const first = await Promise.all(Array.from({ length: 5 }, deliver));
  const statuses = await Promise.all(first.map(async (r) => [r.status, await r.json()]));
  // Each concurrent delivery was processed, or refused as in progress so the provider retries.
  for (const [status, body] of statuses) {
    if (status === 200) assert.ok(["processed", "duplicate"].includes(body.outcome), JSON.stringify(body));
    else assert.equal(status, 409, JSON.stringify(body));
  }
  assert.equal(statuses.filter(([, b]) => b.outcome === "processed").length, 1);
  for (let i = 0; i < 5; i++) {
    const r = await deliver();
    assert.equal(r.status, 200);
    assert.equal((await r.json()).outcome, "duplicate");
  }
  assert.equal(await count(worker.url), before + 1);
  const bad = await post(worker.url, { path: "/webhooks/payments", body: '{"type":"no id"}' });
  assert.equal(bad.status, 400);
  assert.equal(bad.headers.get("content-type"), "application/problem+json");
});

test("a webhook redelivered after the response retention and inside the key retention is acknowledged as a duplicate (IDEM-INBOX-1)", async () => {
  // The same as a redelivery at 2 h and at 27 h under the default retention (24 h, 7 days),
  // on this worker's 2 s and 4 s.
  const event = JSON.stringify({ id: `evt_${randomBytes(6).toString("hex")}`, type: "payment.succeeded", amount: 4200 });
  const deliver = () => post(worker.url, { path: "/webhooks/payments", body: event });
  const before = await count(worker.url);
  const first = await deliver();
  assert.deepEqual([first.status, await first.json()], [200, { outcome: "processed", received: true }]);
  for (const wait of [200, 2100]) {
    await new Promise((resolve) => setTimeout(resolve, wait));
    const again = await deliver();
    assert.deepEqual([again.status, await again.json()], [200, { outcome: "duplicate", received: true }], `${wait} ms later`);
  }
  assert.equal(await count(worker.url), before + 1, "processed once");
});

