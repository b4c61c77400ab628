// The calls of one process that share a persisted entry (IDEM-JS-9): the calls of
// `idempotentFetch` and `reconcile` with the same `persist` and `id`. The first one in runs
// the entry; an `idempotentFetch` that comes while it runs is the same logical request and
// joins it: it resolves to the first call's result, with a response of its own (a clone), and
// sends nothing. A joining call with another payload is refused by the entry's own check
// (IDEM-CLIENT-1); one whose signal aborts rejects alone; and when the first call ends without
// a result (its signal aborted, or an error), a joining call runs the entry in its place, from
// what it persisted. A `reconcile` joins nothing and is joined by nothing: it waits for the
// call in flight to end before it asks about whatever is left, and a call waits for it.
import { abortReason } from "./client-request.js";

/** The call running each entry, by `persist` object and then by `id`: whether a send may
 * join it, its entry once it has one, and its end (its result, or nothing). */
const running = new WeakMap();

/** `promise`, or a rejection with the signal's reason once it aborts first. */
const untilAborted = (promise, signal) =>
  new Promise((resolve, reject) => {
    const stop = () => reject(abortReason(signal));
    signal?.aborted ? stop() : signal?.addEventListener("abort", stop, { once: true });
    promise.then(resolve, reject);
  });

/**
 * Runs `lead(enter)` as the one call of `options.persist` and `options.id` in this process, or
 * joins the call already running there (see the top of this file). `digest` is the call's
 * payload digest, `undefined` for `reconcile`. `lead` hands its entry to `enter` as soon as it
 * has it. Without `persist` every call runs alone.
 */
export async function joinOrLead({ persist, id }, signal, digest, lead) {
  // Both calls refuse a persist without an id (client-request.js, reconcile).
  if (!persist) return lead(() => {});
  let calls = running.get(persist);
  if (!calls) running.set(persist, (calls = new Map()));
  for (let run; (run = calls.get(id)); ) {
    if (digest && run.joinable) {
      // Taken now, so that the clone is made before the running call's caller reads the body.
      const shared = run.ended.then((r) => r && { ...r, response: r.response?.clone() });
      // Another payload under the id is refused by the entry, as a later call's would be: at
      // once when the running call has its entry, else once it ends with one.
      run.entry?.checkPayload(digest);
      const result = await untilAborted(shared, signal);
      run.entry?.checkPayload(digest);
      if (result) return result;
      // Ended without a result: its entry was kept, and the next call runs it.
    } else {
      await untilAborted(run.ended, signal);
    }
  }
  let end, result;
  const run = { joinable: !!digest, ended: new Promise((r) => (end = r)) };
  calls.set(id, run);
  try {
    return (result = await lead((entry) => (run.entry = entry)));
  } finally {
    // Off the map before a joining call wakes up, so that one that goes on runs the entry.
    calls.delete(id);
    end(result);
  }
}
