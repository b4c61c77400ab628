// A Node response (`http.ServerResponse`, as Express and NestJS on Express have it) between
// an app and the engine: what the app writes is held back until its outcome is stored, and
// the engine's replies are written with their headers. Shared by idem/express and
// idem/nestjs.
import { replyFields } from "./adapter.js";

/** Holds back what the app writes to `res`: `answer` resolves to `{ status, headers, body }`
 * at the first end, and nothing reaches the socket until the outcome is stored. What is
 * written after that first end (a route that answers and then calls `next()` or throws
 * lets a 404 or error handler, or Express's final handler, write too) goes nowhere: the
 * first answer is the answer. `release()` gives `res` its own methods back, without the
 * headers set since. */
export function capture(res) {
  const original = { write: res.write, end: res.end, writeHead: res.writeHead };
  const chunks = [];
  let ended = false;
  let statusMessage;
  let resolve;
  const answer = new Promise((r) => {
    resolve = r;
  });
  const bytes = (chunk, encoding) =>
    typeof chunk === "string" ? Buffer.from(chunk, typeof encoding === "string" ? encoding : "utf8") : Buffer.from(chunk);
  const later = (...args) => {
    const cb = args.find((f) => typeof f === "function");
    if (cb) queueMicrotask(cb);
  };
  res.writeHead = function writeHead(status, reason, headers) {
    if (ended) return res;
    res.statusCode = status;
    const list = typeof reason === "object" && reason !== null ? reason : headers;
    if (Array.isArray(list)) {
      for (let i = 0; i < list.length; i += 2) res.setHeader(list[i], list[i + 1]);
    } else if (list) {
      for (const [name, value] of Object.entries(list)) res.setHeader(name, value);
    }
    return res;
  };
  res.write = function write(chunk, encoding, callback) {
    if (!ended && chunk != null) chunks.push(bytes(chunk, encoding));
    later(encoding, callback);
    return true;
  };
  res.end = function end(chunk, encoding, callback) {
    later(chunk, encoding, callback);
    if (ended) return res;
    ended = true;
    if (chunk != null && typeof chunk !== "function") chunks.push(bytes(chunk, encoding));
    const headers = [];
    for (const [name, value] of Object.entries(res.getHeaders())) {
      for (const v of Array.isArray(value) ? value : [value]) headers.push([name, String(v)]);
    }
    statusMessage = res.statusMessage;
    clearHeaders(res);
    const body = Buffer.concat(chunks);
    resolve({ status: res.statusCode, headers, body: new Uint8Array(body.buffer, body.byteOffset, body.byteLength) });
    return res;
  };
  let released = false;
  const release = () => {
    if (released) return;
    released = true;
    Object.assign(res, original);
    if (ended) {
      clearHeaders(res);
      res.statusMessage = statusMessage;
    }
  };
  return { answer, release };
}

function clearHeaders(res) {
  for (const name of res.getHeaderNames()) res.removeHeader(name);
}

/** Sends the engine's reply (the stored answer, a replay or a refusal). Its headers replace
 * those of the same names already set (by middleware before this one); the rest stay. */
export async function send(res, reply, idem) {
  const { status, fields, body } = await replyFields(idem, reply);
  res.statusCode = status;
  for (const [name, value] of fields) res.setHeader(name, value);
  // Set, not left to Node: once a content-length was removed (the capture clears the
  // headers), Node would send the answer chunked, and its replays would differ from it.
  if (status >= 200 && status !== 204 && status !== 304) res.setHeader("content-length", body.byteLength);
  res.end(Buffer.from(body.buffer, body.byteOffset, body.byteLength));
}

/**
 * Sends the engine's `reply` in place of the next answer the app writes to `res` (an answer
 * the app was always going to write, such as a framework's default for a handler that did
 * not run): that answer goes nowhere, the headers it set are dropped, and those set before
 * this call stay unless the reply's replace them. Resolves once the reply is sent.
 */
export function sendInstead(res, reply, idem) {
  const before = new Map(Object.entries(res.getHeaders()));
  const original = { write: res.write, end: res.end, writeHead: res.writeHead };
  return new Promise((resolve, reject) => {
    res.writeHead = () => res;
    res.write = () => true;
    res.end = () => {
      Object.assign(res, original);
      clearHeaders(res);
      for (const [name, value] of before) res.setHeader(name, value);
      send(res, reply, idem).then(resolve, reject);
      return res;
    };
  });
}
