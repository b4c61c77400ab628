// What the framework adapters (Express, Fastify, NestJS) share around `Idempotency#handle`:
// beginning a guarded request whose handler is the rest of the framework's chain, keeping a
// body read for the fingerprint where the framework's parsers find it, and the engine's
// replies as a framework sets them.

import { readBody } from "./body.js";

/**
 * Begins a guarded request: `idem.handle(input, …)`, where `onRun(context)` starts the rest
 * of the framework's chain and returns the promise of its answer. Resolves to
 * `{ ran: true, done }` once the handler is to run (`done`: the promise of the reply to send
 * once its outcome is stored), or `{ ran: false, reply }` when the engine answered itself (a
 * replay, a refusal): then nothing runs.
 */
export async function begin(idem, input, onRun) {
  let started;
  const running = new Promise((resolve) => (started = resolve));
  const done = idem.handle(input, (context) => {
    const answer = onRun(context);
    started(true);
    return answer;
  });
  if (await Promise.race([running, done.then(() => false)])) return { ran: true, done };
  return { ran: false, reply: await done };
}

const utf8 = new TextDecoder();

/** A JSON media type (`application/json`, `application/problem+json`, …). */
const JSON_TYPE = /^application\/([\w.+-]+\+)?json\b/i;

/**
 * Reads a Node request's body for the fingerprint (`readBody`: the slot of the engine's 413,
 * or `{ bytes, invalid }`) and keeps it where the app reads it, as `req.rawBody`. A JSON body
 * is taken: `req.body` is parsed as `express.json()` would, and the body is marked read, so
 * that the app's body parsers skip it. One that does not parse is left `undefined` (the engine
 * refuses it on a guarded request, IDEM-FP-6), and `invalid` is its `SyntaxError`, for a host
 * that answers it as its framework's parser would. Any other body (a form, an upload, text)
 * is given back to the request stream, read whole or refused, so that the app's own parsers
 * (`express.urlencoded`, multer) read it as without idem (IDEM-JS-11).
 */
export async function readNodeBody(idem, req) {
  const json = isJson(req.headers["content-type"]);
  const bytes = await readBody(idem, req.headers["content-length"], req, !json);
  if (typeof bytes === "number") return bytes;
  req.rawBody = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let invalid;
  if (json) {
    if (bytes.byteLength > 0) {
      try {
        req.body = JSON.parse(utf8.decode(bytes));
      } catch (err) {
        req.body = undefined;
        invalid = err;
      }
    }
    req._body = true;
  }
  return { bytes, invalid };
}

/** Whether `contentType` is a JSON media type. */
export function isJson(contentType) {
  return JSON_TYPE.test(contentType ?? "");
}

/** Header fields that are the framework's and the connection's to set, never a stored
 * answer's: the length (from the body sent) and the framing. */
export function isFraming(name) {
  return name === "content-length" || name === "transfer-encoding";
}

/**
 * The engine's `reply` as a framework sets it: through the problem hook when it is a
 * refusal (replays and the app's answers never are), with its header fields folded by name
 * (a repeated name's values in a list) and without the framing fields. Resolves to
 * `{ status, fields: Map<name, value | values>, body }`.
 */
export async function replyFields(idem, reply) {
  const mapped = idem.mappedRefusal(reply);
  if (mapped !== undefined) {
    reply = { status: mapped.status, headers: [...mapped.headers].flat(), body: new Uint8Array(await mapped.arrayBuffer()) };
  }
  const fields = new Map();
  for (let i = 0; i < reply.headers.length; i += 2) {
    const name = reply.headers[i].toLowerCase();
    if (isFraming(name)) continue;
    const values = fields.get(name);
    if (values === undefined) fields.set(name, [reply.headers[i + 1]]);
    else values.push(reply.headers[i + 1]);
  }
  for (const [name, values] of fields) if (values.length === 1) fields.set(name, values[0]);
  return { status: reply.status, fields, body: reply.body };
}

/** The fields of an answer that belong to it: the `[name, value]` pairs of `now` but those
 * set, with the same value, before the handler ran (`before`, pairs too: CORS, a request id,
 * a cookie from middleware or hooks before the adapter). Those are the request's: stored, a
 * replay to another request would carry them (another origin's
 * `Access-Control-Allow-Origin`). A value the handler changed is its own. Every adapter's
 * rule, idem/hono's included. */
export function ownFields(now, before) {
  // Most requests have nothing set before the handler: no key to make per field.
  if (before.length === 0) return now;
  const earlier = new Set(before.map(([name, value]) => `${name}\n${value}`));
  return now.filter(([name, value]) => !earlier.has(`${name}\n${value}`));
}

/** `ownFields` of a Node response's header record `now` (`getHeaders()`), with `before` the
 * record then as a Map: a flat `[[name, value], …]` list, one entry per value. */
export function answerFields(now, before) {
  return ownFields(nodeFields(Object.entries(now)), nodeFields(before));
}

/** A Node header record's entries as `[name, value]` pairs, one per value. */
function nodeFields(entries) {
  const out = [];
  for (const [name, value] of entries) for (const v of Array.isArray(value) ? value : [value]) out.push([name, String(v)]);
  return out;
}

/** The cookies set before the handler (`before`, `Set-Cookie` values) that stay under a reply
 * setting `cookies`: those whose cookie names it does not set. Every other field of a reply
 * replaces the one of its name set before (IDEM-REPLAY-4); cookies are fields of their own,
 * one per name. */
export function cookiesUnder(before, cookies) {
  const names = new Set(cookies.map(cookieName));
  return before.filter((cookie) => !names.has(cookieName(cookie)));
}

/** The name of the cookie a `Set-Cookie` value sets. */
function cookieName(field) {
  return String(field).split("=", 1)[0].trim();
}
