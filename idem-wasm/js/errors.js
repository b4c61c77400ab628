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

/** The error of a call to `what` that took longer than its `ms` (`IDEM-STORE-4`): the store
 * stopped answering, and the request is answered as for any store failure. */
export function timedOut(what, ms) {
  const e = new Error(`${what} did not answer within ${ms} ms`);
  e.code = "IDEM-STORE-4";
  return e;
}

/** `call`, or a rejection (`timedOut`) once `ms` pass without its answer. What the call does
 * later is not waited for; the engine never counts on it either way. */
export function bounded(call, ms, what) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(timedOut(what, ms)), ms);
  });
  return Promise.race([call, late]).finally(() => clearTimeout(timer));
}

/** The longest delay a timer takes (2^31 - 1 ms, about 24.8 days); a longer one fires at once. */
const MAX_DELAY = 2_147_483_647;

/** `read` (the read of a handler's answer) for no longer than the attempt's lease, as its
 * heartbeats extend it (IDEM-OUT-7). `lease` is the handler's context: `leaseLeft()`, the
 * milliseconds left of it on the engine's clock, and `leaseSettling()`, a heartbeat's write
 * still out (or null), which may move it on. When the lease ends first, `stop` ends the body
 * and the promise rejects (`IDEM-OUT-7`); the host records the outcome as unknown and
 * answers as `Idempotency#handle` does. */
export function withinLease(read, lease, stop) {
  return new Promise((resolve, reject) => {
    let timer;
    let over = false;
    // Never at once: a body already at hand is read even when the lease ended first.
    const arm = (ms) => {
      timer = setTimeout(check, Math.min(Math.max(ms, 0), MAX_DELAY));
    };
    const check = () => {
      if (over) return;
      const ms = lease.leaseLeft();
      if (ms > 0) return arm(ms);
      // A heartbeat on its way may still move the lease on: its answer first.
      const settling = lease.leaseSettling();
      if (settling !== null) return void settling.then(check, check);
      stop();
      reject(rangeError("IDEM-OUT-7", STALLED));
    };
    arm(lease.leaseLeft());
    read.then(
      (value) => {
        over = true;
        clearTimeout(timer);
        resolve(value);
      },
      (err) => {
        over = true;
        clearTimeout(timer);
        reject(err);
      },
    );
  });
}

/** The detail of the 500 problem an attempt's caller gets when its answer stalled. */
export const STALLED = "the response body was not read whole before the lease ended";

/** The failure of a completion that was to commit the handler's own writes with its stored
 * response (a transaction): whether they committed is unknown, and the engine answers 503 in
 * place of the handler's response, which may describe work that was rolled back
 * (`IDEM-STORE-7`). */
export function uncommitted(err) {
  const e = new Error(`the handler's writes may not have committed: ${err?.message ?? err}`, { cause: err });
  e.code = "IDEM-STORE-7";
  return e;
}
