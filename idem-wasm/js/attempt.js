// The attempt a handler's transaction belongs to, shared by the stores that commit a
// handler's own writes with its completion (PostgresStore, DurableObjectLocalStore). Every
// attempt has its own: one that took over a key, apart from the one it displaced, and one at
// a key released and claimed again, which starts over at fence 1.
import { rangeError } from "./errors.js";

/** One attempt at a key: its storage key and the attempt's identity (the context's
 * `attempt`, as the engine gives it to the handler and with each completion). */
export function attemptOf(key, attempt) {
  return `${attempt}:${key}`;
}

/** The attempt of a handler's idempotency context (`idempotencyOf(request)`). */
export function attemptOfContext(context) {
  const key = context?.storageKey;
  if (typeof key !== "string" || typeof context.attempt !== "string") {
    throw rangeError("IDEM-JS-1", "transaction needs the request's idempotency context (idempotencyOf(request))");
  }
  return attemptOf(key, context.attempt);
}
