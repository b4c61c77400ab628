// A Fastify reply between an app and the engine: the answer on its way out (`onSend`) handed
// to the engine and replaced by what it gives back, and the engine's replies set on the
// reply with their headers. Shared by idem/fastify and
// idem/nestjs on the Fastify platform.
import { Readable } from "node:stream";
import { answerFields, isFraming, replyFields } from "./adapter.js";
import { readAnswer } from "./body.js";
import { withinLease } from "./errors.js";

/** A payload on its way out, read up to `limit` bytes (IDEM-STORE-5): `{ body }` with its
 * bytes (a string, a Buffer, a stream that ends within the limit, or nothing), or, for a
 * stream that goes on past it, `{ held, next, stop }`: the chunks read so far, the read of
 * the next one, and what ends the stream early (a Node stream destroyed, a web stream
 * cancelled, at once, even while a read waits). A stream that neither ends nor passes the
 * limit before the lease ends (`context`'s, as heartbeats extend it) is stopped, and the
 * read rejects (IDEM-OUT-7). */
async function readPayload(payload, limit, context) {
  if (payload == null) return { body: new Uint8Array(0) };
  if (typeof payload === "string") return { body: new Uint8Array(Buffer.from(payload)) };
  if (payload instanceof Uint8Array) return { body: payload };
  let next;
  let stop;
  if (typeof payload.getReader === "function") {
    const reader = payload.getReader();
    next = () => reader.read();
    stop = () => reader.cancel().catch(() => {});
  } else if (typeof payload.pipe === "function" || typeof payload[Symbol.asyncIterator] === "function") {
    const rest = payload[Symbol.asyncIterator]();
    next = () => rest.next();
    stop = typeof payload.destroy === "function" ? () => payload.destroy() : () => rest.return?.()?.catch?.(() => {});
  } else {
    return { body: new Uint8Array(Buffer.from(String(payload))) };
  }
  // No longer than the lease, as heartbeats extend it (IDEM-OUT-7).
  const read = await withinLease(readAnswer(next, limit), context, stop);
  return read.bytes === undefined ? { held: read.held, next, stop } : { body: read.bytes };
}

/** A Fetch `Response` payload as Fastify itself unpacks one when it sends it: its status and
 * headers set on `reply`, and its body (null or a stream) the payload. Anything else is
 * returned as it is. */
function fromResponse(reply, payload) {
  if (payload === null || typeof payload !== "object" || Object.prototype.toString.call(payload) !== "[object Response]") return payload;
  if (payload.bodyUsed) throw new TypeError("the Response's body was already read");
  reply.code(payload.status);
  for (const [name, value] of payload.headers) reply.header(name, value);
  return payload.body;
}

/** What was held of a payload, then the rest of it as it comes: a stream Fastify pipes to
 * the client, reading the next chunk when the client has taken the last. When it is
 * destroyed (the client left, even before it was read), the payload is stopped with it. */
function passOn({ held, next, stop }) {
  let at = 0;
  return new Readable({
    async read() {
      if (at < held.length) {
        this.push(held[at]);
        held[at++] = undefined;
        return;
      }
      try {
        const { done, value } = await next();
        this.push(done ? null : value);
      } catch (err) {
        this.destroy(err);
      }
    },
    destroy(err, callback) {
      stop();
      callback(err);
    },
  });
}

/** Sets the engine's reply (a replay, a refusal, another attempt's outcome) on `reply` and
 * returns its body: its headers replace those of the same names already set (by hooks
 * before this one); the rest stay. A refusal goes through the problem hook. */
export async function replyWith(reply, answer, idem) {
  const { status, fields, body } = await replyFields(idem, answer);
  reply.code(status);
  for (const [name, value] of fields) reply.header(name, value);
  return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
}

/** Sends the engine's reply on `reply` (`replyWith`): an empty body without a content type
 * goes out as none, as the app's own did, not as bytes Fastify would type
 * `application/octet-stream`. */
export async function sendReply(reply, answer, idem) {
  const body = await replyWith(reply, answer, idem);
  reply.send(body.byteLength === 0 && !reply.hasHeader("content-type") ? undefined : body);
}

/**
 * In `onSend`, for a request that ran: hands the answer Fastify is about to send (`reply`'s
 * status and headers, `payload`'s bytes) to the engine through `capture.resolve`, waits for
 * `capture.done` (the request's `Idempotency#handle`, which stores it) and returns the bytes
 * to send; a stream longer than the store keeps is recorded so and sent on as it comes.
 * When another attempt took the lease over, its outcome is set on `reply` instead
 * (IDEM-LEASE-5). An error of the engine's rejects, for Fastify's error handling.
 */
export async function answered(capture, reply, payload, idem) {
  let read;
  try {
    read = await readPayload(fromResponse(reply, payload), idem.maxResponseBytes, capture.context);
  } catch (err) {
    // The answer failed before it was read whole (its stream broke, its body was used): the
    // engine records that the handler threw, as it does for Express, and only then does
    // Fastify's error handling answer. One that stalled past the lease is answered by the
    // engine (IDEM-OUT-7): the core's 500 problem, or the key's outcome (IDEM-LEASE-5).
    capture.reject(err);
    if (err?.code !== "IDEM-OUT-7") {
      await capture.done.catch(() => {});
      throw err;
    }
    const answer = await capture.done;
    dropSince(capture, reply);
    for (const name of trailersOf(reply)) reply.removeTrailer(name);
    return replyWith(reply, answer, idem);
  }
  // Not those the hooks before the handler set: they are this request's, not the answer's.
  const headers = answerFields(reply.getHeaders(), capture.before).filter(([name]) => !isFraming(name));
  // Trailer fields (`reply.trailer`), which a stored answer does not carry: the answer is
  // recorded as not kept, and Fastify sends it as it is, trailers included (IDEM-STORE-5).
  const trailers = trailersOf(reply);
  const trailed = trailers.length > 0;
  const passThrough = read.body === undefined || trailed;
  capture.resolve(passThrough ? { status: reply.statusCode, headers, passThrough, trailed } : { status: reply.statusCode, headers, body: read.body });
  const answer = await capture.done;
  if (answer.passThrough) return read.body === undefined ? passOn(read) : Buffer.from(read.body.buffer, read.body.byteOffset, read.body.byteLength);
  // Another attempt's outcome goes out instead: the app's stream is not read further, and
  // its trailers are not sent.
  read.stop?.();
  for (const name of trailers) reply.removeTrailer(name);
  if (answer.executed) return Buffer.from(answer.body.buffer, answer.body.byteOffset, answer.body.byteLength);
  dropSince(capture, reply);
  return replyWith(reply, answer, idem);
}

/**
 * In `onSend`, for a request the engine answered itself while the app still sends an answer
 * of its own (a framework's default for a handler that did not run): sets the engine's
 * `capture.instead` on `reply` in its place and returns its bytes. The headers set since
 * `capture.before` (the record then) are dropped.
 */
export function answerInstead(capture, reply, idem) {
  dropSince(capture, reply);
  return replyWith(reply, capture.instead, idem);
}

/** The symbol Fastify keeps a reply's trailer fields under (its own, named
 * 'fastify.reply.trailers'), once found. */
let trailersKey;

/** The names of the trailer fields `reply` is to send (`reply.trailer(name, fn)`); Fastify
 * has no public list of them. */
function trailersOf(reply) {
  trailersKey ??= Object.getOwnPropertySymbols(reply).find((s) => s.description === "fastify.reply.trailers");
  const fields = trailersKey === undefined ? null : reply[trailersKey];
  if (fields == null) return [];
  return Object.keys(fields).filter((name) => typeof fields[name] === "function");
}

/** Drops the headers set on `reply` since `capture.before` (the record then, a Map): the
 * app's, not the hooks' before it (CORS, a request id), which stay on the engine's reply. */
function dropSince(capture, reply) {
  for (const name of Object.keys(reply.getHeaders())) if (!capture.before.has(name)) reply.removeHeader(name);
}
