// `idem/hono`: Idempotency-Key semantics as Hono middleware. No lifecycle of its own: the
// request goes through `withIdempotency` (the engine's request machine) and the rest of the
// app runs as its handler.
//
//   app.use("/api/*", idempotency({ store, principal: (c) => c.get("userId") }));
import { Idempotency, withIdempotency } from "idem";
import { rangeError } from "./errors.js";

/**
 * Hono middleware. `options` are `withIdempotency`'s (a store and a principal are required;
 * `principal` is called with the Hono context), plus `skip(c)`, a predicate for requests to
 * let through unguarded. Which paths are guarded is the path given to `app.use`; which
 * methods, `options.methods` (POST and PATCH by default). Refusals are problem+json, or what
 * `options.problem(problem, reply)` returns.
 */
export function idempotency(options) {
  if (options === null || typeof options !== "object") throw rangeError("IDEM-JS-1", "idempotency(options) needs { store, principal }");
  const { skip, principal, ...rest } = options;
  if (skip !== undefined && typeof skip !== "function") throw rangeError("IDEM-JS-1", "options.skip must be a function (c) => boolean");
  const idem = new Idempotency({
    ...rest,
    // withIdempotency passes the handler's extra arguments on: here, the Hono context.
    principal: typeof principal === "function" ? (_request, c) => principal(c) : principal,
  });
  const guarded = withIdempotency(async (request, c, next) => {
    // The body was read for the fingerprint: the app reads it again from this request.
    c.req.raw = request;
    await next();
    return c.res;
  }, idem);
  return async function idempotencyMiddleware(c, next) {
    if (skip !== undefined && (await skip(c))) return next();
    const response = await guarded(c.req.raw, c, next);
    // Replaces whatever the app set, headers included: the stored answer is the answer.
    c.res = undefined;
    c.res = response;
  };
}
