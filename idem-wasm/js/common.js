// Helpers that need no WebAssembly, shared by the server and the client entries (the client
// bundle must not pull in the server's glue).

/** A random u32 from a pool refilled with crypto.getRandomValues.
 *
 * The pool is filled on first use, never at module load: Cloudflare Workers refuse to
 * generate random values outside a request handler. It holds 2,048 values (8 KiB): a fill
 * costs about 2 ns per value in Node 20, against 13-16 ns for a pool of 256 (each request
 * takes two). */
let pool = null;
let next = 0;
export function random32() {
  if (pool === null || next >= pool.length) {
    pool ??= new Uint32Array(2048);
    crypto.getRandomValues(pool);
    next = 0;
  }
  return pool[next++];
}

/** Resolves after `ms` milliseconds, or at once when the signal aborts. A timer fires after
 * at most 2^31 - 1 ms (about 24.8 days; a longer one fires at once, with a warning): a longer
 * wait resolves then, and its caller, which waits until a time, sleeps again. */
export function sleep(ms, signal) {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, Math.min(ms, 2 ** 31 - 1));
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}
