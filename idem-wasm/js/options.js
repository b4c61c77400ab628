// The options of `Idempotency` and `withIdempotency`: the host's own are checked here, the
// engine's are read by the module (their names are the module's: `engineOptionNames`).
import { Engine, engineOptionNames } from "./idem_wasm.js";
import { checkTelemetry } from "./telemetry.js";
import { rangeError } from "./util.js";

/** The options the JavaScript side reads itself; the engine options are read by the module. */
export const HOST_OPTIONS = ["store", "principal", "route", "onEvent", "telemetry", "now", "keyHeader", "problem", "statusQueries"];
/** An HTTP field name (RFC 9110 token). */
export const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

let optionNames = null;

const PRINCIPAL_HELP =
  'options.principal is required: a function (request) => the caller\'s stable id (an account or user id, ' +
  'never a bearer token that rotates), or "none" for an API with a single tenant';

/** Checks the options of an `Idempotency`: every name known, a usable store, a principal
 * (IDEM-SCOPE-3), and the host's own options of the right types (IDEM-JS-1). */
export function checkOptions(options) {
  if (options === null || typeof options !== "object") {
    throw rangeError("IDEM-JS-1", "options must be an object with at least a store and a principal");
  }
  optionNames ??= new Set([...HOST_OPTIONS, ...engineOptionNames().split(",")]);
  for (const name of Object.keys(options)) {
    if (!optionNames.has(name)) {
      const hint = name === "scope" ? ` (${PRINCIPAL_HELP})` : "";
      throw rangeError("IDEM-JS-1", `unknown option "${name}"${hint}`);
    }
  }
  const store = options.store;
  const usable =
    store != null &&
    (typeof store.claim === "function" || typeof store.load === "function") &&
    typeof store.apply === "function";
  if (!usable) {
    throw rangeError("IDEM-JS-1", "options.store must implement load(key) and apply(key, write, now)");
  }
  if (options.principal !== "none" && typeof options.principal !== "function") {
    throw rangeError("IDEM-SCOPE-3", PRINCIPAL_HELP);
  }
  if (options.keyHeader !== undefined && (typeof options.keyHeader !== "string" || !HEADER_NAME.test(options.keyHeader))) {
    throw rangeError("IDEM-JS-1", "options.keyHeader must be a header name");
  }
  if (options.statusQueries !== undefined && typeof options.statusQueries !== "boolean") {
    throw rangeError("IDEM-JS-1", "options.statusQueries must be true or false");
  }
  if (options.telemetry !== undefined) checkTelemetry(options.telemetry);
  for (const fn of ["route", "onEvent", "now", "problem"]) {
    if (options[fn] !== undefined && typeof options[fn] !== "function") {
      throw rangeError("IDEM-JS-1", `options.${fn} must be a function`);
    }
  }
}

/** The engine options, as text: what a Durable Object needs to build the same engine. The
 * object claims and answers at once; waiting for a request in flight is the worker's. */
export function engineOptionsText(options) {
  const out = {};
  for (const name of engineOptionNames().split(",")) {
    if (options[name] !== undefined && name !== "inFlight") out[name] = options[name];
  }
  return JSON.stringify(out);
}

/**
 * The engine for these options (the engine options; other members are ignored). Throws a
 * RangeError (IDEM-JS-1; IDEM-TTL-2 when `keyTtl < responseTtl`; IDEM-LEASE-4 when
 * `lease > keyTtl`).
 */
export function createEngine(options) {
  return new Engine(options);
}
