// `idem/fastify`: Idempotency-Key semantics as a Fastify 5 plugin. No lifecycle of its own:
// a guarded request goes through `Idempotency#handle` (the engine's request machine), the
// rest of Fastify's request (parsing, validation, the handler, serialisation) runs as its
// handler, and the answer Fastify is about to send is captured in `onSend`, stored, and then
// sent.
//
//   await app.register(idempotency, { store, principal: (request) => request.user.id });
//   app.post("/orders", { config: { idempotency: true } }, handler);
//
// Routes opt in through their config. The raw body is read in `preParsing` (up to the
// engine's limit, 413 beyond) for the fingerprint and kept as `request.rawBody`; Fastify's
// own parser then parses the same bytes into `request.body`. The claim is made there too,
// so the principal is read after the `onRequest` hooks, the route's own included (where
// authentication belongs in Fastify), and before the route's `preValidation` and
// `preHandler` hooks; and so is a status query answered. A route is guarded by the
// registration nearest to its context: one registered again in a nested context takes its
// routes over from the outer one.
import { Readable } from "node:stream";
import { Idempotency } from "idem";
import { begin } from "./adapter.js";
import { closeUnread, readBody } from "./body.js";
import { rangeError } from "./errors.js";
import { answered, sendReply } from "./fastify-reply.js";

/** Where a guarded request keeps its capture: `{ answer, resolve, done, headers }`. */
const CAPTURE = Symbol("idempotency capture");
/** On a context: the registration of the plugin nearest to it (contexts inherit from their
 * parents, so a nested registration shadows an outer one). */
const REGISTRATION = Symbol("idempotency registration");

/**
 * The Fastify plugin. `options` are `withIdempotency`'s (a store and a principal are
 * required; `principal` is called with the Fastify request), plus `skip(request)`, a
 * predicate for requests to let through unguarded. It guards the routes whose config has
 * `idempotency: true`, in the context it is registered in and below (it does not open a
 * context of its own). A `GET` carrying `Idempotency-Status` in that context is a status
 * query (unless `statusQueries: false`). Refusals are problem+json, or the Response that
 * `options.problem(problem, reply)` returns. Every error (of the store, the principal, the
 * problem hook) goes to Fastify's error handling.
 */
export function idempotency(fastify, options, done) {
  if (options === null || typeof options !== "object") throw rangeError("IDEM-JS-1", "idempotency(options) needs { store, principal }");
  const { skip, principal, ...rest } = options;
  if (skip !== undefined && typeof skip !== "function") throw rangeError("IDEM-JS-1", "options.skip must be a function (request) => boolean");
  const idem = new Idempotency({
    ...rest,
    principal: typeof principal === "function" ? (input) => principal(input.request) : principal,
  });

  const me = {};
  fastify[REGISTRATION] = me;
  const ours = (request) => request.server[REGISTRATION] === me;
  // The URLs of the routes this registration guards, as they are added (a status query is
  // about one of them).
  const guardedUrls = new Set();
  fastify.addHook("onRoute", function (route) {
    if (route.config?.idempotency === true && this[REGISTRATION] === me) guardedUrls.add(route.url);
  });
  /** Whether a GET is a status query about a request this registration guards: one routed to
   * a route it guards, to a route at the URL of one, or (no GET route there) at such a URL. */
  const asksAboutOurs = (request) =>
    request.method === "GET" &&
    idem.statusQueries &&
    request.headers[idem.statusHeader] !== undefined &&
    ours(request) &&
    (request.routeOptions.config?.idempotency === true || guardedUrls.has(request.routeOptions.url ?? request.url.split("?")[0]));

  fastify.addHook("preParsing", async (request, reply, payload) => {
    if (asksAboutOurs(request)) {
      if (skip !== undefined && (await skip(request))) return payload;
      // A status query about the request this URL guards: answered from the store.
      const key = request.headers[idem.keyHeader] ?? null;
      await sendReply(reply, await idem.status({ request, target: request.url, key, status: request.headers[idem.statusHeader], headers: request.headers }), idem);
      return reply;
    }
    if (request.routeOptions.config?.idempotency !== true || !ours(request)) return payload;
    if (skip !== undefined && (await skip(request))) return payload;
    const key = request.headers[idem.keyHeader] ?? null;
    if (!idem.protects(request.method, key !== null)) return payload;
    const body = await readBody(idem, request.headers["content-length"], payload);
    if (typeof body === "number") {
      closeUnread(request.raw, reply.raw);
      await sendReply(reply, await idem.serve(body, (answer) => answer), idem);
      return reply;
    }
    request.rawBody = body;
    const capture = { answer: null, resolve: null, reject: null, done: null, context: null, before: null };
    capture.answer = new Promise((resolve, reject) => {
      capture.resolve = resolve;
      capture.reject = reject;
    });
    const begun = await begin(
      idem,
      {
        request,
        method: request.method,
        target: request.url,
        route: undefined,
        key,
        lowWater: request.headers[idem.lowWaterHeader],
        contentType: request.headers["content-type"],
        // Node's header record (lower-case names); only the fingerprint headers are read.
        headers: request.headers,
        body,
      },
      (context) => {
        request.idempotency = context;
        capture.context = context;
        // The headers the hooks before the handler set: they stay on the engine's replies.
        capture.before = new Map(Object.entries(reply.getHeaders()));
        request[CAPTURE] = capture;
        return capture.answer;
      },
    );
    if (!begun.ran) {
      // The engine answered (a replay or a refusal): nothing runs.
      await sendReply(reply, begun.reply, idem);
      return reply;
    }
    capture.done = begun.done;
    // Fastify's parser reads the same bytes again (and checks them against the length).
    const again = Readable.from(body.byteLength === 0 ? [] : [Buffer.from(body.buffer, body.byteOffset, body.byteLength)]);
    again.receivedEncodedLength = body.byteLength;
    return again;
  });

  fastify.addHook("onSend", async (request, reply, payload) => {
    const capture = request[CAPTURE];
    if (capture === undefined) return payload;
    // The first answer is the answer: what the store gives back is sent as it is.
    request[CAPTURE] = undefined;
    return answered(capture, reply, payload, idem);
  });
  done();
}

// Hooks added in the context the plugin is registered in, not in a context of its own (what
// the `fastify-plugin` package does).
idempotency[Symbol.for("skip-override")] = true;
idempotency[Symbol.for("fastify.display-name")] = "idem";
export default idempotency;

