// What a call of `idempotentFetch` or `reconcile` is given, checked and made ready: its
// options checked (IDEM-JS-1), the retry options as the client's module takes them, and the
// request every attempt is sent from (the template Request, the options `fetch` gets, the
// signal). client.js sends it.
import { rangeError } from "./errors.js";

/** The options of a Request that `fetch` reads from its init, besides method, headers, body
 * and signal (which every attempt sets itself). */
const REQUEST_FIELDS = ["cache", "credentials", "integrity", "keepalive", "mode", "priority", "redirect", "referrer", "referrerPolicy"];

/** The options every attempt is sent with: all of `init` (standard or the runtime's own:
 * workerd's `cf`, undici's `dispatcher` …) over those an input Request was made with. Only
 * the Request's fields that differ from a plain request's are taken, so that a runtime
 * never meets an option the caller did not set. */
function fetchOptions(input, template, init) {
  const options = {};
  if (input instanceof Request) {
    const plain = new Request(template.url);
    for (const name of REQUEST_FIELDS) {
      if (template[name] !== plain[name]) options[name] = template[name];
    }
    // A navigation's mode is the browser's to set: as a Request made from it, same-origin.
    if (options.mode === "navigate") options.mode = "same-origin";
  }
  return Object.assign(options, init);
}

/** The reason `signal` gives for its abort, as `fetch` rejects with it. */
export function abortReason(signal) {
  return signal.reason ?? new DOMException("This operation was aborted", "AbortError");
}

/** The retry options as the module takes them: `base`, `cap`, `maxAttempts` and `deadline`
 * as plain numbers (the module checks them), each undefined for its default; a value that is
 * not a number is NaN, which the module refuses (IDEM-JS-1). */
export function retryArgs(retry) {
  if (retry != null && typeof retry !== "object") throw rangeError("IDEM-JS-1", "options.retry must be an object");
  const r = retry ?? {};
  return [r.base, r.cap, r.maxAttempts, r.deadline].map((v) => (v == null || typeof v === "number" ? v : NaN));
}

function checkOptions(options) {
  if (options.key !== undefined && typeof options.key !== "string") throw rangeError("IDEM-JS-1", "options.key must be a string");
  if (options.keyVersion !== undefined && options.keyVersion !== 4 && options.keyVersion !== 7) {
    throw rangeError("IDEM-JS-1", "options.keyVersion must be 4 or 7");
  }
  const p = options.persist;
  if (p !== undefined && !(p && typeof p.load === "function" && typeof p.save === "function" && typeof p.delete === "function")) {
    throw rangeError("IDEM-JS-1", "options.persist must implement load(id), save(id, bytes) and delete(id)");
  }
  if (p !== undefined && typeof options.id !== "string") {
    throw rangeError("IDEM-JS-1", "options.id (the logical request's id) is required with options.persist");
  }
  if (options.keyFormat !== undefined && options.keyFormat !== "sf-string" && options.keyFormat !== "bare") {
    throw rangeError("IDEM-JS-1", 'options.keyFormat must be "sf-string" or "bare"');
  }
  if (options.keyKind !== undefined && options.keyKind !== "uuid" && options.keyKind !== "unix-time" && options.keyKind !== "counter") {
    throw rangeError("IDEM-JS-1", 'options.keyKind must be "uuid", "unix-time" or "counter"');
  }
  const c = options.counter;
  if (options.keyKind === "counter" && !(c && typeof c.client === "string" && (typeof c.epoch === "string" || typeof c.epoch === "bigint"))) {
    throw rangeError("IDEM-JS-1", 'keyKind "counter" needs options.counter: { client, epoch, bits?, firstSeq? } from the session');
  }
  if (options.clientId !== undefined && typeof options.clientId !== "string") throw rangeError("IDEM-JS-1", "options.clientId must be a string");
  if (options.signal !== undefined) throw rangeError("IDEM-JS-1", "options.signal is not an option: pass the signal in init, as to fetch");
  if (options.reconcile !== undefined && typeof options.reconcile !== "boolean") throw rangeError("IDEM-JS-1", "options.reconcile must be true or false");
}

/** The request fields both calls share: the template Request, its send options and signal. */
export function prepare(input, init, options) {
  checkOptions(options);
  // fetch's own signal: init's, else the input Request's (an explicit null is none).
  const signal = (init.signal !== undefined ? init.signal : input instanceof Request ? input.signal : undefined) ?? undefined;
  if (signal?.aborted) throw abortReason(signal);
  const template = new Request(input, init);
  const kind = options.keyKind ?? "uuid";
  // Kind keys are sent bare; opaque keys as sf-strings unless keyFormat says otherwise.
  const bare = kind !== "uuid" || options.keyFormat === "bare";
  return {
    doFetch: options.fetch ?? globalThis.fetch,
    now: options.now ?? Date.now,
    signal,
    template,
    sendOptions: fetchOptions(input, template, init),
    method: template.method,
    url: template.url,
    kind,
    // An sf-string escapes its quotes and backslashes (RFC 8941 3.3.3).
    keyValue: (key) => (bare ? key : `"${key.replace(/["\\]/g, "\\$&")}"`),
  };
}
