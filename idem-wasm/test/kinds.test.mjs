// The key kinds with rules of their own, through the built package: unix-time keys, wrapping
// counters with their sessions, and server-issued tokens. Every rejection reason of every
// kind, bad inputs, and duplicates racing through the memory store and through Durable
// Object shards (an asynchronous store whose calls interleave).
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { DurableObjectStore, Idempotency, IdempotencyShard, MemoryStore, withIdempotency } from "idem";
import { FakeNamespace, barrier, manualClock } from "./helpers.mjs";

const SECRET = "5f".repeat(32);

function post(path, key, body = { amount: 1 }, headers = {}) {
  const h = { "content-type": "application/json", ...headers };
  if (key !== null) h["idempotency-key"] = key;
  return new Request(`https://api.example${path}`, { method: "POST", headers: h, body: JSON.stringify(body) });
}

/** An API whose side effect is a counter, with the given kind options and store. */
function api(idem, { store = new MemoryStore(), gate } = {}) {
  const state = { executions: 0 };
  const now = idem.now ?? manualClock();
  const core = new Idempotency({
    principal: (request) => request.headers.get("x-user") ?? "user-1",
    store,
    now,
    ...idem,
  });
  const handler = withIdempotency(async (request) => {
    state.executions++;
    const input = await request.json();
    if (gate) await gate();
    return new Response(JSON.stringify({ n: state.executions, input }), {
      status: 201,
      headers: { "content-type": "application/json" },
    });
  }, core);
  return { core, handler, state, now };
}

async function problemOf(response) {
  assert.equal(response.headers.get("content-type"), "application/problem+json");
  const p = await response.json();
  return { status: response.status, type: p.type.replace("urn:idem:problem:", ""), requirement: p.requirement };
}

function stores() {
  return [
    ["memory store", () => new MemoryStore()],
    ["Durable Object store", () => new DurableObjectStore(new FakeNamespace(IdempotencyShard))],
  ];
}

/** 32 requests released together; the handler waits until all have arrived. */
async function race(kindOptions, path, makeStore, prepare) {
  const gate = barrier();
  const { core, handler, state, now } = api(kindOptions, { store: makeStore(), gate: () => gate.wait() });
  const key = await prepare(core, now);
  const all = Array.from({ length: 32 }, () => handler(post(path, key, { amount: 7 })));
  await new Promise((resolve) => setTimeout(resolve, 30));
  gate.open();
  const statuses = (await Promise.all(all)).map((r) => r.status);
  return { statuses, executions: state.executions };
}

describe("unix-time keys", () => {
  const kind = { keyKind: "unix-time", timeKeys: { maxAhead: 60_000, maxAge: 3_600_000 } };

  test("a fresh timestamp runs, the same one replays, another payload collides (IDEM-TIME-1, IDEM-TIME-4)", async () => {
    const { handler, state, now } = api(kind);
    const key = `device-7:${now()}`;
    assert.equal((await handler(post("/payments", key))).status, 201);
    const again = await handler(post("/payments", key));
    assert.equal(again.headers.get("idempotent-replayed"), "true");
    const other = await problemOf(await handler(post("/payments", key, { amount: 2 })));
    assert.deepEqual([other.status, other.type], [422, "key-collision"]);
    // The same millisecond from another client is another key; without a client id too.
    assert.equal((await handler(post("/payments", `device-8:${now()}`))).status, 201);
    assert.equal((await handler(post("/payments", String(now())))).status, 201);
    assert.equal(state.executions, 3);
  });

  test("with timeKeys.clientHeader, two clients sending the same bare timestamp are two keys (IDEM-TIME-1)", async () => {
    const { handler, state, now } = api({ ...kind, timeKeys: { ...kind.timeKeys, clientHeader: "X-Client-Id" } });
    const at = String(now());
    const a = await handler(post("/payments", at, { amount: 1 }, { "x-client-id": "device-a" }));
    const b = await handler(post("/payments", at, { amount: 2 }, { "x-client-id": "device-b" }));
    assert.deepEqual([a.status, b.status], [201, 201]);
    const again = await handler(post("/payments", at, { amount: 1 }, { "x-client-id": "device-a" }));
    assert.equal(again.headers.get("idempotent-replayed"), "true");
    // Without the header the bare timestamp is a key of its own.
    assert.equal((await handler(post("/payments", at, { amount: 3 }))).status, 201);
    assert.equal(state.executions, 3);
    assert.throws(() => api({ ...kind, timeKeys: { clientHeader: "bad header" } }), (e) => e.code === "IDEM-JS-1");
  });

  test("with timeKeys.clientHeader, a status query asks about the client's key, and settling it stops that key (IDEM-TIME-1, IDEM-STATUS-1, IDEM-STATUS-3)", async () => {
    const { handler, state, now } = api({ ...kind, timeKeys: { ...kind.timeKeys, clientHeader: "X-Client-Id" } });
    const client = { "x-client-id": "device-a" };
    const ask = async (key, field = "POST", headers = client) => {
      const response = await handler(new Request("https://api.example/payments", { headers: { "idempotency-key": key, "idempotency-status": field, ...headers } }));
      assert.equal(response.status, 200);
      return response.json();
    };
    const ran = String(now());
    assert.equal((await handler(post("/payments", ran, { amount: 1 }, client))).status, 201);
    const found = await ask(ran);
    assert.equal(found.status, "completed");
    assert.equal(found.response.status, 201);
    // Settling the key that ran does not settle it: it is found completed.
    assert.equal((await ask(ran, "POST; settle")).status, "completed");
    // Another client's key with the same timestamp is another key.
    assert.equal((await ask(ran, "POST", { "x-client-id": "device-b" })).status, "unknown");
    // A key settled before its request arrives never runs.
    const lost = String(now() + 1);
    assert.equal((await ask(lost, "POST; settle")).status, "not-executed");
    const late = await problemOf(await handler(post("/payments", lost, { amount: 1 }, client)));
    assert.deepEqual([late.status, late.type], [409, "key-settled"]);
    assert.equal(state.executions, 1);
  });

  test("with timeKeys.clientHeader, a key sent as an sf-string or naming its own client is accepted (IDEM-TIME-1)", async () => {
    const { handler, state, now } = api({ ...kind, timeKeys: { ...kind.timeKeys, clientHeader: "X-Client-Id" } });
    const at = now();
    const quoted = await handler(post("/payments", `"${at}"`, { amount: 1 }, { "x-client-id": "device-a" }));
    assert.equal(quoted.status, 201);
    // The same key bare, from the same client: the same request, replayed.
    const bare = await handler(post("/payments", String(at), { amount: 1 }, { "x-client-id": "device-a" }));
    assert.equal(bare.headers.get("idempotent-replayed"), "true");
    // A key that names its client keeps it: the header does not go before it.
    const own = await handler(post("/payments", `device-a:${at}`, { amount: 1 }, { "x-client-id": "device-a" }));
    assert.equal(own.headers.get("idempotent-replayed"), "true");
    // A header that is not a client id is refused as such a key would be.
    const bad = await problemOf(await handler(post("/payments", String(at + 1), { amount: 1 }, { "x-client-id": "a b" })));
    assert.equal(bad.status, 400);
    assert.equal(state.executions, 1);
  });

  test("a timestamp beyond the skew is from the future, one past the purge horizon is stale (IDEM-TIME-2, IDEM-TIME-3)", async () => {
    const { handler, state, now } = api(kind);
    const future = await problemOf(await handler(post("/payments", `d:${now() + 60_001}`)));
    assert.deepEqual([future.status, future.type], [400, "key-from-future"]);
    assert.equal((await handler(post("/payments", `d:${now() + 60_000}`))).status, 201);
    const stale = await problemOf(await handler(post("/payments", `d:${now() - 3_600_000}`)));
    assert.deepEqual([stale.status, stale.type], [412, "key-stale"]);
    assert.equal(state.executions, 1);
  });

  test("a key that is not a timestamp is refused and nothing runs (IDEM-TIME-1)", async () => {
    const { handler, state } = api(kind);
    for (const bad of ["-5", "+5", "1.5", "1e3", "abc", "d:", ":5", "bad id:5", "99999999999999999999999"]) {
      const p = await problemOf(await handler(post("/payments", bad)));
      assert.deepEqual([p.status, p.type], [400, "malformed-key"], bad);
    }
    assert.equal(state.executions, 0);
  });

  for (const [name, makeStore] of stores()) {
    test(`32 racing requests with one time key run once through the ${name} (IDEM-EXEC-1)`, async () => {
      for (let round = 0; round < 3; round++) {
        const { statuses, executions } = await race(kind, "/payments", makeStore, (_, now) => `c:${now() - round}`);
        assert.equal(executions, 1);
        assert.equal(statuses.filter((s) => s === 201).length, 1);
        assert.equal(statuses.filter((s) => s === 409).length, 31);
      }
    });
  }
});

describe("counter keys", () => {
  const kind = { keyKind: "counter", counter: { bits: 8, window: 4 } };
  const route = "/transfers";

  test("without a session the client is unknown; a session's numbers run, replay and collide (IDEM-CTR-3, IDEM-CTR-7, IDEM-CTR-8)", async () => {
    const { core, handler, state } = api(kind);
    const unknown = await problemOf(await handler(post(route, "app-1:5:0")));
    assert.deepEqual([unknown.status, unknown.type], [412, "unknown-client"]);
    const { epoch } = await core.openSession(post("/sessions", null), { route, client: "app-1" });
    assert.match(epoch, /^\d+$/);
    assert.equal((await handler(post(route, `app-1:${epoch}:0`))).status, 201);
    assert.equal((await handler(post(route, `app-1:${epoch}:0`))).headers.get("idempotent-replayed"), "true");
    const collision = await problemOf(await handler(post(route, `app-1:${epoch}:0`, { amount: 9 })));
    assert.deepEqual([collision.status, collision.type], [422, "key-collision"]);
    assert.equal((await handler(post(route, `app-1:${epoch}:1`))).status, 201);
    assert.equal(state.executions, 2);
  });

  test("the low-water mark makes older numbers stale; a mark beyond the next number is refused (IDEM-CTR-6, IDEM-CTR-11)", async () => {
    const { core, handler, state } = api(kind);
    const { epoch } = await core.openSession(post("/sessions", null), { route, client: "c" });
    for (const seq of [0, 1, 2]) assert.equal((await handler(post(route, `c:${epoch}:${seq}`))).status, 201);
    const bad = await problemOf(await handler(post(route, `c:${epoch}:3`, { amount: 1 }, { "idempotency-low-water": "9" })));
    assert.deepEqual([bad.status, bad.type], [400, "invalid-low-water"]);
    assert.equal((await handler(post(route, `c:${epoch}:3`, { amount: 1 }, { "idempotency-low-water": "2" }))).status, 201);
    const stale = await problemOf(await handler(post(route, `c:${epoch}:1`)));
    assert.deepEqual([stale.status, stale.type], [412, "key-stale"]);
    assert.equal(state.executions, 4);
  });

  test("a gap beyond the window waits; a new epoch makes the old one stale and a later one unknown (IDEM-CTR-4, IDEM-CTR-5, IDEM-CTR-9)", async () => {
    const { core, handler } = api(kind);
    const first = await core.openSession(post("/sessions", null), { route, client: "c" });
    const gap = await problemOf(await handler(post(route, `c:${first.epoch}:4`)));
    assert.deepEqual([gap.status, gap.type], [409, "counter-gap"]);
    const next = await core.openSession(post("/sessions", null), { route, client: "c", firstSeq: 10 });
    assert.equal(BigInt(next.epoch), BigInt(first.epoch) + 1n);
    const old = await problemOf(await handler(post(route, `c:${first.epoch}:10`)));
    assert.deepEqual([old.status, old.type], [412, "stale-epoch"]);
    const ahead = await problemOf(await handler(post(route, `c:${BigInt(next.epoch) + 5n}:10`)));
    assert.deepEqual([ahead.status, ahead.type], [412, "unknown-epoch"]);
    assert.equal((await handler(post(route, `c:${next.epoch}:10`))).status, 201);
  });

  test("the window cannot slide past a number still running: 409 counter-window-full with Retry-After (IDEM-CTR-10)", async () => {
    const gate = barrier();
    let first = true;
    const { core, handler, state } = api(kind, {
      gate: async () => {
        if (first) {
          first = false;
          await gate.wait();
        }
      },
    });
    const { epoch } = await core.openSession(post("/sessions", null), { route, client: "slow" });
    const running = handler(post(route, `slow:${epoch}:0`));
    await new Promise((resolve) => setTimeout(resolve, 10));
    for (const seq of [1, 2, 3]) assert.equal((await handler(post(route, `slow:${epoch}:${seq}`))).status, 201);
    const full = await handler(post(route, `slow:${epoch}:4`));
    const p = await problemOf(full);
    assert.deepEqual([p.status, p.type], [409, "counter-window-full"]);
    assert.ok(Number(full.headers.get("retry-after")) >= 1);
    gate.open();
    assert.equal((await running).status, 201);
    assert.equal((await handler(post(route, `slow:${epoch}:4`, { amount: 1 }, { "idempotency-low-water": "1" }))).status, 201);
    assert.equal(state.executions, 5);
  });

  test("8-bit counters wrap: 600 sequential requests with the window advancing, none lost or doubled (IDEM-CTR-2)", async () => {
    const { core, handler, state } = api(kind);
    const { epoch } = await core.openSession(post("/sessions", null), { route, client: "w" });
    for (let i = 0; i < 600; i++) {
      const seq = i % 256;
      const low = String(Math.max(0, i - 2) % 256);
      const r = await handler(post(route, `w:${epoch}:${seq}`, { i }, { "idempotency-low-water": low }));
      assert.equal(r.status, 201, `request ${i}`);
      // Each one retried at once replays.
      const again = await handler(post(route, `w:${epoch}:${seq}`, { i }, { "idempotency-low-water": low }));
      assert.equal(again.headers.get("idempotent-replayed"), "true", `retry ${i}`);
    }
    assert.equal(state.executions, 600);
  });

  test("bad counter keys and sessions are refused and nothing runs (IDEM-CTR-1)", async () => {
    const { core, handler, state } = api(kind);
    const { epoch } = await core.openSession(post("/sessions", null), { route, client: "c" });
    for (const bad of [`c:${epoch}:256`, `c:${epoch}:-1`, `c:${epoch}:x`, "c:1", `c:${epoch}:1:2`, `no spaces:${epoch}:0`, `c:-${epoch}:0`]) {
      const p = await problemOf(await handler(post(route, bad)));
      assert.deepEqual([p.status, p.type], [400, "malformed-key"], bad);
    }
    for (const [client, firstSeq] of [["bad id", 0], ["c", 256], ["c", -1], ["c", 1.5], ["c", "x"]]) {
      await assert.rejects(core.openSession(post("/sessions", null), { route, client, firstSeq }), (e) => e instanceof RangeError && e.code === "IDEM-CTR-1", `${client} ${firstSeq}`);
    }
    assert.equal(state.executions, 0);
  });

  for (const [name, makeStore] of stores()) {
    test(`32 racing requests with one counter value run once through the ${name} (IDEM-CTR-12)`, async () => {
      for (let round = 0; round < 3; round++) {
        const { statuses, executions } = await race(kind, route, makeStore, async (core) => {
          const { epoch } = await core.openSession(post("/sessions", null), { route, client: `r${round}` });
          return `r${round}:${epoch}:0`;
        });
        assert.equal(executions, 1);
        assert.equal(statuses.filter((s) => s === 201).length, 1);
        assert.equal(statuses.filter((s) => s === 409).length, 31);
      }
    });
  }
});

describe("server-issued tokens", () => {
  const kind = { keyKind: "token", token: { secret: SECRET, ttl: 60_000 } };
  const route = "/checkout";

  test("the token endpoint issues a token that runs once and then replays (IDEM-TOKEN-1, IDEM-TOKEN-2)", async () => {
    const { core, handler, state, now } = api(kind);
    const response = await core.tokenResponse(post("/idempotency-tokens", null), { route });
    assert.equal(response.status, 201);
    assert.equal(response.headers.get("cache-control"), "no-store");
    const { token, expiresAt, ttl } = await response.json();
    assert.match(token, /^tok_[0-9a-f]{64}$/);
    assert.equal(expiresAt, now() + 60_000);
    assert.equal(ttl, 60_000);
    assert.equal((await handler(post(route, token))).status, 201);
    assert.equal((await handler(post(route, token))).headers.get("idempotent-replayed"), "true");
    const mismatch = await problemOf(await handler(post(route, token, { amount: 2 })));
    assert.equal(mismatch.status, 422);
    assert.equal(state.executions, 1);
  });

  test("forged, foreign, unknown and expired tokens are refused and nothing runs (IDEM-TOKEN-3, IDEM-TOKEN-4)", async () => {
    const { core, handler, state, now } = api(kind);
    const { token } = await core.issueToken(post("/idempotency-tokens", null), { route });
    const flipped = token.slice(0, -1) + (token.endsWith("0") ? "1" : "0");
    for (const bad of [flipped, "tok_" + "0".repeat(64), "tok_short"]) {
      const p = await problemOf(await handler(post(route, bad)));
      assert.deepEqual([p.status, p.type], [400, "token-forged"], bad);
    }
    // Issued for another user: it does not verify in this user's scope.
    const foreign = await core.issueToken(post("/idempotency-tokens", null, {}, { "x-user": "user-2" }), { route });
    assert.equal((await problemOf(await handler(post(route, foreign.token)))).type, "token-forged");
    // Authentic but never stored here (issued by another instance with the same secret).
    const elsewhere = api(kind);
    const lost = await elsewhere.core.issueToken(post("/idempotency-tokens", null), { route });
    assert.deepEqual(Object.values(await problemOf(await handler(post(route, lost.token)))).slice(0, 2), [400, "token-unknown"]);
    // Never used before its expiry: gone for good.
    const unused = await core.issueToken(post("/idempotency-tokens", null), { route });
    now.advance(60_001);
    assert.deepEqual(Object.values(await problemOf(await handler(post(route, unused.token)))).slice(0, 2), [410, "token-expired"]);
    assert.equal(state.executions, 0);
  });

  test("options: a token secret of 64 hex digits and a TTL, kind options for their kind only (IDEM-JS-1)", () => {
    const store = new MemoryStore();
    const make = (extra) => () => new Idempotency({ principal: "none", store, ...extra });
    for (const bad of [
      { keyKind: "token", token: { ttl: 1000 } },
      { keyKind: "token", token: { secret: "ab".repeat(31), ttl: 1000 } },
      { keyKind: "token", token: { secret: "zz".repeat(32), ttl: 1000 } },
      { keyKind: "token", token: { secret: SECRET } },
      { keyKind: "token", token: { secret: SECRET, ttl: 1000, extra: 1 } },
      { keyKind: "opaque", counter: { bits: 8 } },
      { keyKind: "counter", counter: { bits: 7 } },
      { keyKind: "counter", counter: { bits: 8, window: 65 } },
      { keyKind: "unix-time", timeKeys: { maxAge: 8 * 24 * 3_600_000 } },
    ]) {
      assert.throws(make(bad), (e) => e instanceof RangeError && e.code === "IDEM-JS-1", JSON.stringify(bad));
    }
    const opaque = new Idempotency({ principal: "none", store });
    return assert.rejects(opaque.issueToken({}, { route }), (e) => e.code === "IDEM-JS-1");
  });

  test("a token or a session for a route that is no route, or with a method that is not a string, is refused (IDEM-JS-1)", async () => {
    const tokens = new Idempotency({ principal: "none", store: new MemoryStore(), keyKind: "token", token: { secret: SECRET, ttl: 60_000 } });
    const counters = new Idempotency({ principal: "none", store: new MemoryStore(), keyKind: "counter" });
    const request = new Request("http://x.test/sessions", { method: "POST", body: '{"client":"c1"}' });
    for (const bad of [{}, { route: "" }, { route: 5 }, { route, method: 5 }, { route, method: null }]) {
      const why = JSON.stringify(bad);
      await assert.rejects(tokens.issueToken({}, bad), (e) => e instanceof RangeError && e.code === "IDEM-JS-1", why);
      await assert.rejects(tokens.tokenResponse({}, bad), (e) => e instanceof RangeError && e.code === "IDEM-JS-1", why);
      await assert.rejects(counters.openSession({}, { client: "c1", ...bad }), (e) => e instanceof RangeError && e.code === "IDEM-JS-1", why);
      await assert.rejects(counters.sessionResponse(request.clone(), bad), (e) => e instanceof RangeError && e.code === "IDEM-JS-1", why);
    }
  });

  for (const [name, makeStore] of stores()) {
    test(`32 racing requests with one token run once through the ${name} (IDEM-TOKEN-2)`, async () => {
      for (let round = 0; round < 3; round++) {
        const { statuses, executions } = await race(kind, route, makeStore, async (core) => (await core.issueToken(post("/idempotency-tokens", null), { route })).token);
        assert.equal(executions, 1);
        assert.equal(statuses.filter((s) => s === 201).length, 1);
        assert.equal(statuses.filter((s) => s === 409).length, 31);
      }
    });
  }
});

describe("keys without a key header", () => {
  test("derived keys: a double submit with a changed timestamp is one execution; another payload is another (IDEM-DERIVE-4)", async () => {
    const { handler, state } = api({ keyFallback: "derive", fingerprint: { exclude: ["/sentAt"] } });
    const first = await handler(post("/forms", null, { item: "a", sentAt: 1 }));
    assert.equal(first.status, 201);
    const again = await handler(post("/forms", null, { sentAt: 2, item: "a" }));
    assert.equal(again.headers.get("idempotent-replayed"), "true");
    assert.equal((await handler(post("/forms", null, { item: "b", sentAt: 3 }))).status, 201);
    // Another user's identical form is theirs.
    assert.equal((await handler(post("/forms", null, { item: "a", sentAt: 1 }, { "x-user": "user-2" }))).status, 201);
    assert.equal(state.executions, 3);
  });

  test("a key from a JSON pointer into the body; a body without one is refused (IDEM-KEY-7)", async () => {
    const { handler, state } = api({ keyFallback: { jsonPointer: "/meta/key" } });
    const body = { meta: { key: "form-17" }, item: "a" };
    assert.equal((await handler(post("/forms", null, body))).status, 201);
    assert.equal((await handler(post("/forms", null, body))).headers.get("idempotent-replayed"), "true");
    for (const [bad, type] of [[{ item: "a" }, "missing-key"], [{ meta: { key: 7 } }, "malformed-key"]]) {
      const p = await problemOf(await handler(post("/forms", null, bad)));
      assert.deepEqual([p.status, p.type], [400, type]);
    }
    assert.equal(state.executions, 1);
  });

  test("keyFallback is for opaque and UUID keys, as \"derive\" or { jsonPointer } (IDEM-JS-1)", () => {
    for (const bad of [{ keyFallback: "always" }, { keyFallback: { jsonPointer: "no-slash" } }, { keyKind: "counter", keyFallback: "derive" }]) {
      assert.throws(() => new Idempotency({ principal: "none", store: new MemoryStore(), ...bad }), (e) => e.code === "IDEM-JS-1", JSON.stringify(bad));
    }
  });
});
