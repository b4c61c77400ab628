// The worker's settings, read from its environment (`[vars]` in wrangler.toml, or
// `wrangler dev --var NAME:value`, or bindings given to Miniflare). Plain JavaScript with no
// import, so that Node tests can check it directly.

/** Every variable the worker reads, with its default. */
export const DEFAULTS = Object.freeze({
  IDEM_KEYS: "required",
  IDEM_KEY_KIND: "opaque",
  IDEM_RESPONSE_TTL_MS: "86400000",
  IDEM_KEY_TTL_MS: "604800000",
  IDEM_LEASE_MS: "60000",
  IDEM_IN_FLIGHT: "reject",
  IDEM_UNKNOWN_OUTCOME: "reexecute",
  IDEM_MAX_BODY_BYTES: "65536",
  IDEM_LOG_EVENTS: "security",
  ORDER_DELAY_MS: "0",
  ORDER_WRITES_ONLY: "on",
  UNPROTECTED_ROUTE: "off",
  IDEM_COUNTER_BITS: "32",
  IDEM_COUNTER_WINDOW: "8",
  IDEM_TOKEN_TTL_MS: "3600000",
});

/** The variables the worker reads that have no default of its own: unset, the engine's
 * default applies (the time-key bounds: fitted to the key retention by the engine). */
export const ENGINE_DEFAULTS = Object.freeze(["IDEM_TIME_MAX_AHEAD_MS", "IDEM_TIME_MAX_AGE_MS"]);

/** The token secret: a secret (`wrangler secret put`), never a `[vars]` entry. */
const TOKEN_SECRET = "IDEM_TOKEN_SECRET";
/** The keys that seal the idempotency records in Durable Object storage: a secret too. */
const SEAL_KEYS = "IDEM_SEAL_KEYS";

/** A setting the worker refuses; `variable` names the culprit. */
export class ConfigError extends Error {
  constructor(variable, message) {
    super(`${variable}: ${message}`);
    this.name = "ConfigError";
    this.variable = variable;
  }
}

function text(env, name) {
  const value = env?.[name];
  if (value === undefined || value === null || value === "") return DEFAULTS[name];
  return String(value).trim();
}

function wholeNumber(env, name, { min = 1, max = Number.MAX_SAFE_INTEGER } = {}) {
  const raw = text(env, name);
  if (!/^[0-9]+$/.test(raw)) throw new ConfigError(name, `must be a whole number, not "${raw}"`);
  const n = Number(raw);
  if (n < min || n > max) throw new ConfigError(name, `must be between ${min} and ${max}, not ${n}`);
  return n;
}

/** `options[key]` set to the whole number of `name` when it is set (see `ENGINE_DEFAULTS`). */
function given(options, key, env, name) {
  if (text(env, name) !== undefined) options[key] = wholeNumber(env, name);
  return options;
}

function oneOf(env, name, allowed) {
  const raw = text(env, name);
  if (!allowed.includes(raw)) {
    throw new ConfigError(name, `must be one of ${allowed.map((a) => `"${a}"`).join(", ")}, not "${raw}"`);
  }
  return raw;
}

function inFlight(env) {
  const raw = text(env, "IDEM_IN_FLIGHT");
  if (raw === "reject") return "reject";
  const wait = /^wait:([0-9]+)$/.exec(raw);
  if (wait !== null && Number(wait[1]) > 0 && Number(wait[1]) <= 60_000) return { wait: Number(wait[1]) };
  throw new ConfigError("IDEM_IN_FLIGHT", `must be "reject" or "wait:MS" (1 to 60000 ms), not "${raw}"`);
}

/**
 * The settings in `env`, checked. Throws `ConfigError` on the first bad variable. The
 * engine checks the rest (for example that the key retention is at least the response
 * retention) when the options reach it.
 */
export function readConfig(env) {
  const responseTtl = wholeNumber(env, "IDEM_RESPONSE_TTL_MS");
  const keyTtl = wholeNumber(env, "IDEM_KEY_TTL_MS");
  if (keyTtl < responseTtl) {
    throw new ConfigError("IDEM_KEY_TTL_MS", `must be at least IDEM_RESPONSE_TTL_MS (${responseTtl}), not ${keyTtl}`);
  }
  const secret = String(env?.[TOKEN_SECRET] ?? "").trim();
  if (secret !== "" && !/^[0-9a-fA-F]{64}$/.test(secret)) {
    throw new ConfigError(TOKEN_SECRET, "must be 32 random bytes as 64 hex digits");
  }
  // The kinds' bounds must not outlast the key retention (a purged time key could run again,
  // a token outlive its record): the engine fits its own defaults to it, and refuses bounds
  // given here that do not fit, as a misconfiguration with its own error.
  const timeKeys = given(given({}, "maxAhead", env, "IDEM_TIME_MAX_AHEAD_MS"), "maxAge", env, "IDEM_TIME_MAX_AGE_MS");
  return {
    kinds: {
      timeKeys,
      counter: {
        bits: wholeNumber(env, "IDEM_COUNTER_BITS", { min: 8, max: 64 }),
        window: wholeNumber(env, "IDEM_COUNTER_WINDOW", { max: 1024 }),
      },
      // Without a secret the token routes answer 500 misconfigured: a default secret would
      // let anyone who read this file forge tokens.
      token: secret === "" ? null : { secret, ttl: wholeNumber(env, "IDEM_TOKEN_TTL_MS") },
    },
    idempotency: {
      keys: oneOf(env, "IDEM_KEYS", ["required", "optional"]),
      keyKind: oneOf(env, "IDEM_KEY_KIND", ["opaque", "opaque-strict", "uuid", "uuid-v4", "uuid-v7"]),
      responseTtl,
      keyTtl,
      lease: wholeNumber(env, "IDEM_LEASE_MS"),
      inFlight: inFlight(env),
      unknownOutcome: oneOf(env, "IDEM_UNKNOWN_OUTCOME", ["reexecute", "store", "hold"]),
      fingerprint: { maxBody: wholeNumber(env, "IDEM_MAX_BODY_BYTES", { max: 100 * 1024 * 1024 }) },
    },
    logEvents: oneOf(env, "IDEM_LOG_EVENTS", ["off", "security", "all"]),
    orderDelayMs: wholeNumber(env, "ORDER_DELAY_MS", { min: 0, max: 60_000 }),
    writesOnly: oneOf(env, "ORDER_WRITES_ONLY", ["on", "off"]) === "on",
    unprotectedRoute: oneOf(env, "UNPROTECTED_ROUTE", ["on", "off"]) === "on",
    seal: sealOption(env),
  };
}

/**
 * The seal option of the Durable Object stores (IDEM-SEAL-1): from the secret
 * `IDEM_SEAL_KEYS`, `ID:BASE64` (a key id and 32 bytes of key), comma-separated, the key that
 * seals first. Undefined when it is not set. Throws `ConfigError` when it does not parse; the
 * stores check the ids and lengths.
 */
export function sealOption(env) {
  const raw = String(env?.[SEAL_KEYS] ?? "").trim();
  if (raw === "") return undefined;
  const keys = raw.split(",").map((entry) => {
    const [id, b64, extra] = entry.trim().split(":");
    if (!id || !b64 || extra !== undefined) throw new ConfigError(SEAL_KEYS, "each key is ID:BASE64 (openssl rand -base64 32)");
    let bytes;
    try {
      bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    } catch {
      throw new ConfigError(SEAL_KEYS, `the key of "${id}" is not base64`);
    }
    if (bytes.byteLength !== 32) throw new ConfigError(SEAL_KEYS, `the key of "${id}" is ${bytes.byteLength} bytes, not 32`);
    return { id, key: bytes };
  });
  return { keys };
}

/** `configKey` per environment object: the runtime passes the same one to every request. */
const keys = new WeakMap();

/** The variables that `readConfig` reads, as one string: a cache key for the settings. */
export function configKey(env) {
  let key = typeof env === "object" && env !== null ? keys.get(env) : undefined;
  if (key !== undefined) return key;
  key = [...Object.keys(DEFAULTS), ...ENGINE_DEFAULTS]
    .map((name) => `${name}=${text(env, name) ?? ""}`)
    .concat(`${TOKEN_SECRET}=${env?.[TOKEN_SECRET] ?? ""}`)
    .join("\n");
  if (typeof env === "object" && env !== null) keys.set(env, key);
  return key;
}
