// `idem/express`: Idempotency-Key semantics as Express middleware (Express 4 and 5). No
// lifecycle of its own: the request goes through `Idempotency#handle` (the engine's request
// machine), and the rest of the Express chain runs as its handler, with the response it
// writes captured, stored, and then sent.
//
//   app.use("/api", idempotency({ store, principal: (req) => req.user.id }));
//
// Mount it before body parsers: it reads the raw body (up to the engine's limit, 413
// beyond) for the fingerprint, and leaves it as `req.rawBody`, with `req.body` parsed from
// JSON when the content type says JSON (so that express.json() after it has nothing to do);
// any other body (a form, an upload) is left in the request for the parsers after it.
// A body that something mounted before it has already read is refused (IDEM-JS-6).
import { Idempotency } from "idem";
import { readNodeBody } from "./adapter.js";
import { closeUnread } from "./body.js";
import { rangeError } from "./errors.js";
import { capture, send } from "./node-response.js";

/**
 * Express middleware. `options` are `withIdempotency`'s (a store and a principal are
 * required; `principal` is called with the Express request), plus `skip(req)`, a predicate
 * for requests to let through unguarded. Refusals are problem+json, or the Response that
 * `options.problem(problem, reply)` returns. Every error (of the store, the principal, the
 * problem hook, a body read before) goes to Express's error handling.
 */
export function idempotency(options) {
  if (options === null || typeof options !== "object") throw rangeError("IDEM-JS-1", "idempotency(options) needs { store, principal }");
  const { skip, principal, ...rest } = options;
  if (skip !== undefined && typeof skip !== "function") throw rangeError("IDEM-JS-1", "options.skip must be a function (req) => boolean");
  const idem = new Idempotency({
    ...rest,
    principal: typeof principal === "function" ? (input) => principal(input.req) : principal,
  });
  return function idempotencyMiddleware(req, res, next) {
    const held = { capture: null };
    serve(idem, skip, req, res, next, held).catch((err) => {
      // The app's own writes reach the response again, for its error handler.
      held.capture?.release();
      // A response closed before the app ended it has no one to answer.
      if (err?.responseGone !== true) next(err);
    });
  };
}

async function serve(idem, skip, req, res, next, held) {
  if (skip !== undefined && (await skip(req))) return next();
  // Node's header record: lower-case names, as every name read here is (`req.get` would
  // lower-case each again).
  const fields = req.headers;
  const field = req.method === "GET" && idem.statusQueries ? fields[idem.statusHeader] : undefined;
  if (field !== undefined) {
    // A status query about the request this URL guards: answered from the store.
    return send(res, await idem.status({ req, target: req.originalUrl, key: fields[idem.keyHeader] ?? null, status: field, headers: fields }), idem);
  }
  const key = fields[idem.keyHeader] ?? null;
  if (!idem.protects(req.method, key !== null)) return next();
  if (bodyTaken(req)) throw bodyTakenError();
  const read = await readNodeBody(idem, req);
  if (typeof read === "number") {
    closeUnread(req, res);
    return send(res, await idem.serve(read, (reply) => reply), idem);
  }
  const reply = await idem.handle(
    {
      req,
      method: req.method,
      target: req.originalUrl,
      route: undefined,
      key,
      lowWater: fields[idem.lowWaterHeader],
      contentType: fields["content-type"],
      // Only the fingerprint headers are read.
      headers: fields,
      body: read.bytes,
    },
    (context) => {
      req.idempotency = context;
      held.capture = capture(res, idem.maxResponseBytes, context);
      next();
      return held.capture.answer;
    },
  );
  return send(res, reply, idem, held.capture ?? undefined);
}

/** Whether something before this middleware has read the body, or is reading it: a body
 * parser mounted first (body-parser 1 marks `_body`; any reader leaves the stream read,
 * ended or flowing). The fingerprint would then be taken of nothing, and a reused key with
 * another payload replayed instead of refused. */
function bodyTaken(req) {
  return req._body === true || req.readableDidRead === true || req.readableEnded === true || req.readableFlowing === true;
}

function bodyTakenError() {
  const err = new Error(
    "idem/express: the request body was already read by a middleware mounted before idempotency() " +
      "(a body parser such as express.json, urlencoded, text or raw), so it cannot be fingerprinted. " +
      "Mount idempotency() first: it leaves the raw body as req.rawBody, and req.body parsed when it is JSON.",
  );
  err.code = "IDEM-JS-6";
  err.status = 500;
  err.expose = false;
  return err;
}
