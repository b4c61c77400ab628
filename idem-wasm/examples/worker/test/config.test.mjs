// The worker's settings: wrangler.toml's [vars] match the defaults in config.js, good values
// become withIdempotency options, and bad ones are refused with the variable's name.
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { ConfigError, DEFAULTS, ENGINE_DEFAULTS, configKey, readConfig, sealOption } from "../src/config.js";
import { Idempotency, MemoryStore } from "../../../dist/node.js";
import { EXAMPLE_DIR } from "./runtime.mjs";

const { unstable_getMiniflareWorkerOptions } = await import("wrangler");

test("wrangler.toml sets every variable the worker has a default for, to it, and leaves the engine's unset", () => {
  const { bindings } = unstable_getMiniflareWorkerOptions(join(EXAMPLE_DIR, "wrangler.toml")).workerOptions;
  assert.deepEqual(bindings, { ...DEFAULTS });
  for (const name of ENGINE_DEFAULTS) assert.equal(name in DEFAULTS, false, name);
});

test("the defaults become withIdempotency options", () => {
  assert.deepEqual(readConfig({}), {
    kinds: {
      timeKeys: {},
      counter: { bits: 32, window: 8 },
      token: null,
    },
    idempotency: {
      keys: "required",
      keyKind: "opaque",
      responseTtl: 86_400_000,
      keyTtl: 604_800_000,
      lease: 60_000,
      inFlight: "reject",
      unknownOutcome: "reexecute",
      fingerprint: { maxBody: 65_536 },
    },
    logEvents: "security",
    orderDelayMs: 0,
    writesOnly: true,
    unprotectedRoute: false,
    seal: undefined,
  });
});

test("values from the environment are read, numbers or strings, with the wait policy", () => {
  const config = readConfig({
    IDEM_KEYS: "optional",
    IDEM_KEY_KIND: "uuid-v7",
    IDEM_RESPONSE_TTL_MS: 1000,
    IDEM_KEY_TTL_MS: " 2000 ",
    IDEM_LEASE_MS: "500",
    IDEM_IN_FLIGHT: "wait:2500",
    IDEM_UNKNOWN_OUTCOME: "hold",
    IDEM_MAX_BODY_BYTES: "10",
    IDEM_LOG_EVENTS: "off",
    ORDER_DELAY_MS: "250",
    ORDER_WRITES_ONLY: "off",
    UNPROTECTED_ROUTE: "on",
  });
  assert.deepEqual(config.idempotency, {
    keys: "optional",
    keyKind: "uuid-v7",
    responseTtl: 1000,
    keyTtl: 2000,
    lease: 500,
    inFlight: { wait: 2500 },
    unknownOutcome: "hold",
    fingerprint: { maxBody: 10 },
  });
  assert.equal(config.unprotectedRoute, true);
  assert.equal(config.orderDelayMs, 250);
  assert.equal(config.writesOnly, false);
  assert.equal(config.logEvents, "off");
  // An empty value means the default.
  assert.equal(readConfig({ IDEM_LEASE_MS: "" }).idempotency.lease, 60_000);
});

test("bad values are refused, naming the variable", () => {
  const cases = [
    [{ IDEM_LEASE_MS: "1.5" }, "IDEM_LEASE_MS"],
    [{ IDEM_LEASE_MS: "0" }, "IDEM_LEASE_MS"],
    [{ IDEM_LEASE_MS: "-1" }, "IDEM_LEASE_MS"],
    [{ IDEM_RESPONSE_TTL_MS: "1e3" }, "IDEM_RESPONSE_TTL_MS"],
    [{ IDEM_RESPONSE_TTL_MS: "9007199254740993" }, "IDEM_RESPONSE_TTL_MS"],
    [{ IDEM_RESPONSE_TTL_MS: "5000", IDEM_KEY_TTL_MS: "4999" }, "IDEM_KEY_TTL_MS"],
    [{ IDEM_KEYS: "sometimes" }, "IDEM_KEYS"],
    [{ IDEM_KEY_KIND: "counter" }, "IDEM_KEY_KIND"],
    [{ IDEM_IN_FLIGHT: "wait:0" }, "IDEM_IN_FLIGHT"],
    [{ IDEM_IN_FLIGHT: "wait:60001" }, "IDEM_IN_FLIGHT"],
    [{ IDEM_IN_FLIGHT: "queue" }, "IDEM_IN_FLIGHT"],
    [{ IDEM_UNKNOWN_OUTCOME: "retry" }, "IDEM_UNKNOWN_OUTCOME"],
    [{ IDEM_MAX_BODY_BYTES: "1MiB" }, "IDEM_MAX_BODY_BYTES"],
    [{ IDEM_LOG_EVENTS: "verbose" }, "IDEM_LOG_EVENTS"],
    [{ UNPROTECTED_ROUTE: "yes" }, "UNPROTECTED_ROUTE"],
    [{ ORDER_WRITES_ONLY: "true" }, "ORDER_WRITES_ONLY"],
    [{ ORDER_DELAY_MS: "60001" }, "ORDER_DELAY_MS"],
    [{ ORDER_DELAY_MS: "-5" }, "ORDER_DELAY_MS"],
  ];
  for (const [env, variable] of cases) {
    assert.throws(
      () => readConfig(env),
      (err) => err instanceof ConfigError && err.variable === variable && err.message.startsWith(`${variable}: `),
      JSON.stringify(env),
    );
  }
});

test("the cache key changes with every variable and ignores others", () => {
  const base = configKey({});
  assert.equal(configKey({ OTHER: "x" }), base);
  assert.equal(configKey({ IDEM_LEASE_MS: "60000" }), base, "a default spelled out is the default");
  for (const name of [...Object.keys(DEFAULTS), ...ENGINE_DEFAULTS]) {
    assert.notEqual(configKey({ [name]: "changed" }), base, name);
  }
});

test("the kinds' bounds are passed as given, never cut to fit: the engine fits its defaults and refuses what does not fit", () => {
  const store = new MemoryStore();
  const timeKeys = (env) => ({ ...readConfig(env).idempotency, store, principal: "none", keyKind: "unix-time", timeKeys: readConfig(env).kinds.timeKeys });
  // Unset, the engine's defaults, fitted to a key retention shorter than them.
  const short = { IDEM_RESPONSE_TTL_MS: "1000", IDEM_KEY_TTL_MS: "2000", IDEM_LEASE_MS: "500" };
  assert.deepEqual(readConfig(short).kinds.timeKeys, {});
  assert.ok(new Idempotency(timeKeys(short)));
  // Given, as given.
  const given = { ...short, IDEM_TIME_MAX_AHEAD_MS: "500", IDEM_TIME_MAX_AGE_MS: "5000" };
  assert.deepEqual(readConfig(given).kinds.timeKeys, { maxAhead: 500, maxAge: 5000 });
  assert.throws(
    () => new Idempotency(timeKeys(given)),
    (err) => err.code === "IDEM-JS-1" && /key retention/.test(err.message),
  );
  assert.deepEqual(readConfig({ ...given, IDEM_TIME_MAX_AGE_MS: "1500" }).kinds.timeKeys, { maxAhead: 500, maxAge: 1500 });
  assert.ok(new Idempotency(timeKeys({ ...given, IDEM_TIME_MAX_AGE_MS: "1500" })));
  // A token's validity too.
  const secret = "ab".repeat(32);
  const tokens = readConfig({ ...short, IDEM_TOKEN_SECRET: secret, IDEM_TOKEN_TTL_MS: "3000" });
  assert.deepEqual(tokens.kinds.token, { secret, ttl: 3000 });
  assert.throws(
    () => new Idempotency({ ...tokens.idempotency, store, principal: "none", keyKind: "token", token: tokens.kinds.token }),
    (err) => err.code === "IDEM-JS-1" && /key retention/.test(err.message),
  );
  // A zero bound is the worker's to refuse, naming the variable.
  assert.throws(() => readConfig({ IDEM_TIME_MAX_AHEAD_MS: "0" }), (err) => err instanceof ConfigError && err.variable === "IDEM_TIME_MAX_AHEAD_MS");
});

test("IDEM_SEAL_KEYS: ID:BASE64 pairs, the sealing one first, or a ConfigError naming the variable", () => {
  const key = (byte) => Buffer.alloc(32, byte).toString("base64");
  assert.equal(sealOption({}), undefined);
  const seal = sealOption({ IDEM_SEAL_KEYS: `new:${key(2)}, old:${key(1)}` });
  assert.deepEqual(
    seal.keys.map((k) => [k.id, k.key.byteLength, k.key[0]]),
    [
      ["new", 32, 2],
      ["old", 32, 1],
    ],
  );
  assert.equal(readConfig({ IDEM_SEAL_KEYS: `k:${key(3)}` }).seal.keys[0].id, "k");
  for (const bad of ["nocolon", `k:${key(1)}:x`, "k:!!!", `k:${Buffer.alloc(16).toString("base64")}`, ":abc"]) {
    assert.throws(() => sealOption({ IDEM_SEAL_KEYS: bad }), (e) => e instanceof ConfigError && e.variable === "IDEM_SEAL_KEYS", bad);
  }
});
