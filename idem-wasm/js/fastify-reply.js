// A Fastify reply between an app and the engine: the answer on its way out (`onSend`) handed
// to the engine and replaced by what it gives back, and the engine's replies set on the
// reply with their headers. Shared by idem/fastify and
// idem/nestjs on the Fastify platform.
import { isFraming, replyFields } from "./adapter.js";

/** The bytes of a payload on its way out: a string, a Buffer, a stream, or nothing. */
async function bytesOf(payload) {
  if (payload == null) return new Uint8Array(0);
  if (typeof payload === "string") return new Uint8Array(Buffer.from(payload));
  if (payload instanceof Uint8Array) return payload;
  if (typeof payload.pipe === "function" || typeof payload[Symbol.asyncIterator] === "function") {
    const chunks = [];
    for await (const chunk of payload) chunks.push(typeof chunk === "string" ? Buffer.from(chunk) : chunk);
    return new Uint8Array(Buffer.concat(chunks));
  }
  return new Uint8Array(Buffer.from(String(payload)));
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

/**
 * In `onSend`, for a request that ran: hands the answer Fastify is about to send (`reply`'s
 * status and headers, `payload`'s bytes) to the engine through `capture.resolve`, waits for
 * `capture.done` (the request's `Idempotency#handle`, which stores it) and returns the bytes
 * to send. When another attempt took the lease over, its outcome is set on `reply` instead
 * (IDEM-LEASE-5). An error of the engine's rejects, for Fastify's error handling.
 */
export async function answered(capture, reply, payload, idem) {
  const body = await bytesOf(payload);
  const headers = [];
  for (const [name, value] of Object.entries(reply.getHeaders())) {
    if (isFraming(name)) continue;
    for (const v of Array.isArray(value) ? value : [value]) headers.push([name, String(v)]);
  }
  capture.resolve({ status: reply.statusCode, headers, body });
  const answer = await capture.done;
  if (answer.executed) return Buffer.from(answer.body.buffer, answer.body.byteOffset, answer.body.byteLength);
  for (const [name] of headers) reply.removeHeader(name);
  return replyWith(reply, answer, idem);
}

/**
 * In `onSend`, for a request the engine answered itself while the app still sends an answer
 * of its own (a framework's default for a handler that did not run): sets the engine's
 * `capture.instead` on `reply` in its place and returns its bytes. The headers set since
 * `capture.before` (the names present then) are dropped.
 */
export function answerInstead(capture, reply, idem) {
  for (const name of Object.keys(reply.getHeaders())) if (!capture.before.has(name)) reply.removeHeader(name);
  return replyWith(reply, capture.instead, idem);
}
