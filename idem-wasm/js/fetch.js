// The Fetch adapter: `withIdempotency(handler, options)` for Fetch-standard handlers
// (`Request` → `Response`: Workers, Deno, Bun, Node), and `idempotencyOf(request)` for the
// handler it runs. It reads the key, the body and the target from the `Request`, and the
// `Idempotency` class (server.js) does the rest.
import { Ran } from "./idem_wasm.js";
import { passOn, readAnswer, readBody } from "./body.js";
import { builtBodies, streamedBodies } from "./answers.js";
import { Idempotency, routeOf } from "./server.js";
import { NULL_BODY_STATUS, flatHeaders, rangeError } from "./util.js";
import { withinLease } from "./errors.js";

const EMPTY = new Uint8Array(0);

/** Per-request idempotency context, for handlers: see `idempotencyOf`. */
const contexts = new WeakMap();

/**
 * The idempotency context of a request that `withIdempotency` is executing: the key, whether
 * this execution takes over from an attempt whose lease expired (`recovered`: reconcile
 * before acting), the fencing number, when the lease ends, and `extend()`, a heartbeat for
 * long handlers. `undefined` for requests that pass through (no key, or a method that is
 * not guarded).
 */
export function idempotencyOf(request) {
  return contexts.get(request);
}

/** Path and query of a request URL, as `url.pathname + url.search` gives them (a URL that
 * is not plain http(s) goes through the URL parser). */
function targetOf(href) {
  const scheme = href.startsWith("https://") ? 8 : href.startsWith("http://") ? 7 : 0;
  const path = scheme === 0 ? -1 : href.indexOf("/", scheme);
  if (path < 0) {
    const url = new URL(href);
    return url.pathname + url.search;
  }
  let end = href.indexOf("#", path);
  if (end < 0) end = href.length;
  // An empty query ("?" alone) is no query, as `url.search` says.
  if (href.charCodeAt(end - 1) === 63 && href.indexOf("?", path) === end - 1) end--;
  return href.slice(path, end);
}

/**
 * Wraps a Fetch handler `(request, ...rest) => Response` with Idempotency-Key semantics.
 * Guarded requests (POST and PATCH by default) with a key are claimed before the handler
 * runs; a retry gets the stored response with `Idempotent-Replayed: true`; a duplicate in
 * flight gets 409 with `Retry-After` (or waits, with `inFlight: { wait }`); a changed payload
 * gets 422; a bad key or body gets 400/413. All refusals are `application/problem+json`.
 * The response is stored before it is returned. `options.principal` says who sent each
 * request (see `Idempotency`). A `GET` with `Idempotency-Status` is a status query about the
 * key it carries, answered from the store without calling the handler (see
 * `Idempotency#status`; `statusQueries: false` lets it through to the handler).
 */
export function withIdempotency(handler, options) {
  if (typeof handler !== "function") throw rangeError("IDEM-JS-1", "handler must be a function");
  // An Idempotency of its own, or one the caller also uses (to issue tokens, open sessions).
  const idem = options instanceof Idempotency ? options : new Idempotency(options);
  const route = options.route ?? null;
  const answer = (reply) => idem.responseOf(reply);
  return async function idempotent(request, ...rest) {
    const method = request.method;
    const headers = request.headers;
    if (method === "GET" && idem.statusQueries) {
      const field = headers.get(idem.statusHeader);
      if (field !== null) {
        // A status query about the request this URL guards: answered from the store.
        const target = targetOf(request.url);
        const principal = await idem.principalOf(request, ...rest);
        const queried = route ? await route(request, new URL(request.url)) : routeOf(target);
        return idem.serve(idem.statusSlot(headers.get(idem.keyHeader), principal, queried, field, headers), answer);
      }
    }
    const key = headers.get(idem.keyHeader);
    if (!idem.protects(method, key !== null)) return handler(request, ...rest);
    const body = await readBody(idem, headers.get("content-length"), request);
    if (typeof body === "number") return idem.serve(body, answer);
    const href = request.url;
    const target = targetOf(href);
    const slot = idem.begin(
      key,
      await idem.principalOf(request, ...rest),
      method,
      route ? await route(request, new URL(href)) : routeOf(target),
      target,
      headers.get("content-type"),
      headers,
      body,
      headers.get(idem.lowWaterHeader) ?? undefined,
    );
    return idem.serve(slot, answer, async (context) => {
      // The handler gets a request it can read: the body was read for the fingerprint.
      // (Bytes read mean a body; only for none is `request.body` asked, which makes Deno and
      // Bun build a stream.)
      const forHandler = body.byteLength !== 0 || request.body !== null ? new Request(request, { body }) : request;
      contexts.set(forHandler, context);
      let response;
      let bytes;
      let built;
      let longer;
      try {
        response = await handler(forHandler, ...rest);
        if (!(response instanceof Response)) throw rangeError("IDEM-JS-1", "the handler must return a Response");
        built = response.bodyUsed ? undefined : builtBodies.get(response);
        // The body is read to store it, unless the context built it (IDEM-JS-5): no await
        // on the body, so writes the handler left pending go to storage with the completion.
        // A body that fails is a failed attempt, like a throw.
        // `response.body` is asked only of an empty body, to tell it from none: asked first,
        // Deno and Bun would build a stream and read through it.
        if (NULL_BODY_STATUS.has(response.status)) bytes = null;
        else if (built !== undefined) bytes = built;
        else if (streamedBodies.any && !response.bodyUsed && streamedBodies.streams.has(response.body)) {
          // A stream the context was given: held no further than the store keeps.
          const reader = response.body.getReader();
          // No longer than the lease, as heartbeats extend it (IDEM-OUT-7).
          const read = await withinLease(readAnswer(() => reader.read(), idem.maxResponseBytes), context, () => reader.cancel().catch(() => {}));
          if (read.bytes === undefined) longer = { held: read.held, reader };
          else bytes = read.bytes;
        } else {
          // Past the lease, a body read whole is abandoned: it cannot be cancelled half-way.
          bytes = new Uint8Array(await withinLease(response.arrayBuffer(), context, () => {}));
          if (bytes.byteLength === 0 && response.body === null) bytes = null;
        }
      } catch (err) {
        // Any failure goes on, but an answer that stalled past the lease (IDEM-OUT-7).
        return answer(await context.threw(err));
      }
      // A body longer than the store keeps is recorded as such, then sent on as it comes
      // (IDEM-STORE-5).
      let instead = longer === undefined
        ? context.finish(Ran.Answered, response.status, flatHeaders(response.headers), bytes ?? EMPTY)
        : context.finish(Ran.Oversized, response.status, null, EMPTY);
      if (instead instanceof Promise) instead = await instead;
      if (instead !== null) {
        longer?.reader.cancel().catch(() => {});
        return answer(instead);
      }
      if (longer !== undefined) {
        return new Response(passOn(longer.held, longer.reader), { status: response.status, statusText: response.statusText, headers: response.headers });
      }
      // A body that was read to store it is given to the caller again, in a new response.
      return bytes === null || built !== undefined
        ? response
        : new Response(bytes, { status: response.status, statusText: response.statusText, headers: response.headers });
    });
  };
}
