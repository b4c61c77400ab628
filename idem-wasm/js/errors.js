// Errors with a stable code, shared by the main bundle and the entries beside it (stores,
// adapters), which must not pull in the WebAssembly glue.

/** A RangeError with a stable code (a requirement ID from spec/requirements.toml). */
export function rangeError(code, message) {
  const e = new RangeError(message);
  e.code = code;
  return e;
}

/** The error of a stream that closed before its end (Node's code for it): `what` says which. */
export function prematureClose(what) {
  const e = new Error(`${what} closed before it was complete`);
  e.code = "ERR_STREAM_PREMATURE_CLOSE";
  return e;
}

/** An option that is a duration: `fallback` when undefined, otherwise a whole number of
 * milliseconds above zero, or a RangeError naming `name` (IDEM-JS-1). */
export function milliseconds(value, fallback, name) {
  if (value === undefined) return fallback;
  if (!(Number.isSafeInteger(value) && value > 0)) throw rangeError("IDEM-JS-1", `${name} must be a whole number of milliseconds above zero`);
  return value;
}

/** `call`, or a rejection (`IDEM-STORE-4`) once `ms` pass without its answer: the store
 * stopped answering, and the request is answered as for any store failure. What the call does
 * later is not waited for; the engine never counts on it either way. */
export function bounded(call, ms, what) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => {
      const e = new Error(`${what} did not answer within ${ms} ms`);
      e.code = "IDEM-STORE-4";
      reject(e);
    }, ms);
  });
  return Promise.race([call, late]).finally(() => clearTimeout(timer));
}
