// `idem/hono`: Idempotency-Key semantics as Hono middleware. No lifecycle of its own: the
// request goes through `withIdempotency` (the engine's request machine) and the rest of the
// app runs as its handler.
//
//   app.use("/api/*", idempotency({ store, principal: (c) => c.get("userId") }));
//
// Middleware mounted before it keeps working: a body it read through Hono (`c.req.json()`,
// a validator) is fingerprinted from the bytes Hono kept, and the headers it set before
// `next()` (CORS, a request id) are the current request's: laid under every answer sent
// (the handler's, a replay, a refusal), and never stored.
import { Idempotency, idempotencyOf, plainProblem, withIdempotency } from "idem";
import { cookiesUnder, ownFields } from "./adapter.js";
import { rangeError } from "./errors.js";

const textEncoder = new TextEncoder();

/**
 * Hono middleware. `options` are `withIdempotency`'s (a store and a principal are required;
 * `principal` is called with the Hono context), plus `skip(c)`, a predicate for requests to
 * let through unguarded. Which paths are guarded is the path given to `app.use`; which
 * methods, `options.methods` (POST and PATCH by default). Refusals are problem+json, or what
 * `options.problem(problem, reply)` returns. Headers that middleware before it set on the
 * context stay on every answer, unless the answer has a header of the same name; they are
 * not stored with the handler's answer. A body that middleware before it read with
 * `c.req.json()`, `text()`, `arrayBuffer()` or `blob()` (or a validator) is fingerprinted
 * from the bytes Hono kept; when the bytes sent cannot be had (a body read past `c.req`, a
 * text that lost bytes when decoded), the answer is a 500 `about:blank` problem, and
 * nothing runs.
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
  const guarded = withIdempotency(async (request, c, next, before) => {
    // The body was read for the fingerprint: the app reads it again from this request.
    c.req.raw = request;
    await next();
    // A route that returned nothing: Hono answers its not-found handler's answer, and so
    // is it stored (not the empty 200 that reading `c.res` would make).
    if (!c.finalized) c.res = await c.notFound();
    // Hono merged the headers set before this middleware into the answer: they are this
    // request's, not the answer's to store and replay to another one. (A request let
    // through unguarded stores nothing.)
    return idempotencyOf(request) === undefined ? c.res : withoutHeaders(c.res, before);
  }, idem);
  return async function idempotencyMiddleware(c, next) {
    if (skip !== undefined && (await skip(c))) return next();
    const before = headersSoFar(c);
    let request = c.req.raw;
    if (request.bodyUsed && idem.protects(request.method, request.headers.has(idem.keyHeader))) request = await readAgain(c.req);
    const response =
      request === undefined
        ? plainProblem(500, "idem/hono: the request body was read before idempotency() other than through c.req (json, text, arrayBuffer, blob), so it cannot be fingerprinted")
        : await guarded(request, c, next, before);
    // Set without Hono's merge of the context's headers (which would put the handler's
    // back on a replay or refusal): those set before this middleware are laid under it here.
    c.res = undefined;
    c.res = withHeaders(response, before);
  };
}

/** The headers set on the context so far (by middleware before this one), but its content
 * type, which is the answer's own (as Hono's own merge leaves it). `c.newResponse` copies
 * them without making the context's response, which would change how Hono builds the
 * handler's. */
function headersSoFar(c) {
  const headers = c.newResponse(null, 200).headers;
  headers.delete("content-type");
  return headers;
}

/** `response` without the fields set before it (`ownFields`: same name and value; each
 * cookie on its own); itself when there are none, so that an answer the idempotency context
 * built is stored from its bytes (IDEM-JS-5). */
function withoutHeaders(response, before) {
  const set = [...before];
  if (set.length === 0) return response;
  const all = [...response.headers];
  const own = ownFields(all, set);
  return own.length === all.length ? response : new Response(response.body, { status: response.status, statusText: response.statusText, headers: own });
}

/** `response` with the fields of `before` whose names it does not have (a cookie: whose
 * cookie name, `cookiesUnder`): its own replace those of the same names, as idem/express and
 * idem/fastify send the engine's replies. */
function withHeaders(response, before) {
  let headers;
  const cookies = cookiesUnder(before.getSetCookie(), response.headers.getSetCookie());
  for (const [name, value] of before) {
    if (name === "set-cookie" ? !cookies.includes(value) : response.headers.has(name)) continue;
    headers ??= new Headers(response.headers);
    headers.append(name, value);
  }
  return headers === undefined ? response : new Response(response.body, { status: response.status, statusText: response.statusText, headers });
}

/** A copy of the request with the body a middleware before this one read through Hono, which
 * keeps it (`c.req.bodyCache`); undefined when the bytes the client sent cannot be had. */
async function readAgain(req) {
  const bytes = await keptBytes(req);
  return bytes === undefined ? undefined : new Request(req.raw, { body: bytes });
}

/** The bytes of the body Hono kept. Hono derives every other form of it from the first one
 * read (`bodyCache`'s first key): the bytes themselves only from `arrayBuffer` or `blob`;
 * from `text` only when decoding lost nothing (it drops a byte-order mark, which leaves the
 * length short of `Content-Length`, and makes U+FFFD of malformed UTF-8); never from parsed
 * JSON (older Hono) or form data, nor when the raw body was read past Hono. */
async function keptBytes(req) {
  const first = Object.keys(req.bodyCache ?? {})[0];
  if (first === "arrayBuffer" || first === "blob") return new Uint8Array(await req.arrayBuffer());
  if (first !== "text") return undefined;
  const text = await req.text();
  if (text.includes("\uFFFD")) return undefined;
  const bytes = textEncoder.encode(text);
  const declared = req.raw.headers.get("content-length");
  return declared === null || Number(declared) === bytes.byteLength ? bytes : undefined;
}
