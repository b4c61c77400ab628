// The responses a handler builds through its context (`respond`, `json`), and what
// `withIdempotency` (fetch.js) knows of them: the bytes a response was built from, stored
// without reading its body back and returned as it is (IDEM-JS-5), or the stream it was
// given, read no further than the store keeps (IDEM-STORE-5).
import { bytesNow } from "./util.js";

/** Responses built by `respond` or `json` → the bytes they were built from. */
export const builtBodies = new WeakMap();
/** The streams given to `respond`: `withIdempotency` reads a response whose body is one no
 * further than the store keeps, and sends a longer one on as it comes. Known by the stream,
 * not the response: a response made again around the same stream is still one of them
 * (Hono makes the handler's answer again to add the headers set before it). `any` says
 * whether there has been one, so that a host that never streams never asks a response for
 * its `body` (which makes Deno and Bun build a stream for bytes). */
export const streamedBodies = { streams: new WeakSet(), any: false };

/** `new Response(body, init)`, whose bytes `withIdempotency` stores as they were given,
 * without reading the body back, and which it returns as it is. A stream is read no
 * further than the store keeps: a longer one is sent on as it comes. */
export function respond(body, init) {
  const response = new Response(body, init);
  const bytes = bytesNow(body);
  // The response took its own copy of a buffer; so does the record, so that a buffer the
  // handler changes afterwards changes neither. Blobs and forms are read back.
  if (bytes !== undefined) builtBodies.set(response, ArrayBuffer.isView(body) || body instanceof ArrayBuffer ? bytes.slice() : bytes);
  else if (body instanceof ReadableStream) {
    streamedBodies.streams.add(body);
    streamedBodies.any = true;
  }
  return response;
}

/** `Response.json(value, init)`, stored as `respond` stores its body. */
export function json(value, init) {
  const text = JSON.stringify(value);
  if (text === undefined) throw new TypeError("the value has no JSON form");
  return respond(text, { ...init, headers: withJsonType(init?.headers) });
}

/** `headers` (what a Response takes) with `content-type: application/json` unless they name
 * a content type: a plain record is extended as it is, anything else becomes a Headers. */
function withJsonType(headers) {
  if (headers == null) return { "content-type": "application/json" };
  if (Object.getPrototypeOf(headers) === Object.prototype) {
    for (const name in headers) if (name.toLowerCase() === "content-type") return headers;
    return { ...headers, "content-type": "application/json" };
  }
  const out = new Headers(headers);
  if (!out.has("content-type")) out.set("content-type", "application/json");
  return out;
}
