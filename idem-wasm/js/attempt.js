// The attempt a handler's transaction belongs to, shared by the stores that commit a
// handler's own writes with its completion (PostgresStore, DurableObjectLocalStore). An
// attempt that took over a key has a transaction of its own, apart from the one it displaced.
import { rangeError } from "./errors.js";

/** One attempt at a key: its storage key and its lease's fence. */
export function attemptOf(key, fence) {
  return `${fence}:${key}`;
}

/** The attempt of a handler's idempotency context (`idempotencyOf(request)`). */
export function attemptOfContext(context) {
  const key = context?.storageKey;
  if (typeof key !== "string" || typeof context.fence !== "number") {
    throw rangeError("IDEM-JS-1", "transaction needs the request's idempotency context (idempotencyOf(request))");
  }
  return attemptOf(key, context.fence);
}
