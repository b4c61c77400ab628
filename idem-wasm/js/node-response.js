// A Node response (`http.ServerResponse`, as Express and NestJS on Express have it) between
// an app and the engine: what the app writes is held back until its outcome is stored, and
// the engine's replies are written with their headers. Shared by idem/express and
// idem/nestjs.
//
// One file for one object, the `ServerResponse` between the app and the engine: the capture
// replaces its methods and gives them back, and `send` and `sendInstead` write through the
// same methods once the capture has let go, so the three are read together.
import { answerFields, cookiesUnder, replyFields } from "./adapter.js";
import { prematureClose, withinLease } from "./errors.js";

/** Holds back what the app writes to `res`: `answer` resolves to `{ status, headers, body }`
 * at the first end, and nothing reaches the socket until the outcome is stored. What is
 * written after that first end (a route that answers and then calls `next()` or throws
 * lets a 404 or error handler, or Express's final handler, write too) goes nowhere: the
 * first answer is the answer. `answer` rejects (an error with `responseGone`) when the app
 * destroys the response before it ended it (as `stream.pipeline` does when its source
 * fails): the outcome is then unknown. A client that goes away first (a timeout, then a
 * retry with the same key) changes nothing for the app, which goes on: its answer is still
 * awaited, within the lease (`IDEM-OUT-7`), and stored for the retry, which meanwhile finds
 * the key in flight; taken for unknown at once, the key would be free for the retry to run
 * it again beside the app.
 * `release()` gives `res` its own methods back, without the headers set since; `seal()`,
 * once the stored answer is sent, makes what the app still writes go nowhere again.
 * Bad arguments throw as Node's own methods do (a status out of range, a chunk that is not
 * text or bytes), so that the app's error handling answers them.
 *
 * No more than `limit` bytes of a body are held (IDEM-STORE-5): once the body grows past
 * it, `answer` resolves to `{ status, headers, passThrough: true }`, further writes are
 * held and answered `false` (a piped source waits for `'drain'`), and `flush()`, once the
 * outcome is stored, sends what is held and gives `res` its own methods back, so that the
 * rest goes out as the app writes it, at the pace the client reads. The head is the one
 * `res` had when the body passed the limit, and from then until the app's end
 * `res.headersSent` is true, as if Node had sent it.
 *
 * Code that took `res`'s methods while they were the capture's (a wrapper mounted after
 * this one) keeps calling them: once `res` has its own back, they pass to those.
 *
 * Once the app has begun its answer (its first write or `writeHead`), the answer is held no
 * longer than the lease of `context` (the handler's), as heartbeats extend it: an app that
 * neither ends it nor passes the limit by then has `answer` rejected (`IDEM-OUT-7`), and
 * what it writes after the engine's reply goes nowhere. An answer that ends with trailer fields (`addTrailers`) resolves `answer` as
 * `{ status, headers, passThrough: true, trailed: true }`, and `flush()` sends it as it is,
 * trailers included (IDEM-STORE-5). */
export function capture(res, limit, context) {
  const original = { write: res.write, end: res.end, writeHead: res.writeHead, addTrailers: res.addTrailers, destroy: res.destroy };
  // Whether the app destroyed the response before it ended it.
  let destroyed = false;
  // The trailer fields the app added, for the answer's end.
  let trailers = null;
  // The headers set before the app ran (by middleware before the adapter).
  const before = Object.entries(res.getHeaders());
  const chunks = [];
  let size = 0;
  let ended = false;
  let headWritten = false;
  // Past the limit: the app's end, whether a write was answered false, and the head as it
  // was then.
  let over = false;
  let finished = false;
  let waiting = false;
  let head = null;
  // What the methods here do: hold what the app writes; pass it to `res`'s own (once the
  // methods are given back: code that took them before, a wrapper mounted after this one,
  // still calls them); or nothing (once the stored answer is sent).
  let mode = HOLD;
  let statusMessage;
  let resolve;
  let reject;
  const answer = new Promise((r, j) => {
    resolve = r;
    reject = j;
  });
  // The lease's bound on the answer, from its first byte or head on.
  let begun = false;
  let ending = false;
  const begin = () => {
    begun = true;
    withinLease(answer, context, () => {}).catch((err) => {
      if (err?.code === "IDEM-OUT-7") reject(err);
    });
  };
  res.once("close", () => {
    if (ended || over) return;
    if (destroyed) reject(responseGone());
    // The client went away: the app's answer is awaited no longer than the lease.
    else if (!begun) begin();
  });
  const hold = (chunk) => {
    chunks.push(chunk);
    size += chunk.byteLength;
    if (over || size <= limit) return;
    over = true;
    // As Node's first write does: the head, through whatever wraps `writeHead`.
    if (!headWritten) res.writeHead(res.statusCode);
    // The head goes out as it is now: status and headers set later go nowhere, as once Node
    // has sent a head. Until the app's end, the head counts as sent, so that an error
    // handler takes its "already sent" path (Express's closes the connection, as without
    // idem) instead of writing an answer of its own into this one.
    head = { status: res.statusCode, message: res.statusMessage, fields: Object.entries(res.getHeaders()) };
    Object.defineProperty(res, "headersSent", { configurable: true, get: () => !finished });
    resolve({ status: res.statusCode, headers: [], passThrough: true });
  };
  const ours = {
    destroy(err) {
      if (mode === HOLD && !ended) destroyed = true;
      return original.destroy.call(res, err);
    },
    addTrailers(fields) {
      if (mode === PASS) return original.addTrailers.call(res, fields);
      if (mode === SEALED || ended || finished) return;
      trailers = { ...trailers, ...(Array.isArray(fields) ? Object.fromEntries(fields) : fields) };
    },
    writeHead(status, reason, headers) {
      if (mode === PASS) return original.writeHead.call(res, status, reason, headers);
      if (ended || mode === SEALED) return res;
      checkStatus(status);
      // (From `end`, the answer is whole at once: nothing to bound.)
      if (!begun && !ending) begin();
      res.statusCode = status;
      if (typeof reason === "string") res.statusMessage = reason;
      headWritten = true;
      const list = typeof reason === "object" && reason !== null ? reason : headers;
      if (Array.isArray(list)) {
        // A name given twice in the raw list is two fields (two cookies), as Node sends them.
        const seen = new Set();
        for (let i = 0; i < list.length; i += 2) {
          const name = String(list[i]).toLowerCase();
          if (seen.has(name)) res.appendHeader(list[i], list[i + 1]);
          else res.setHeader(list[i], list[i + 1]);
          seen.add(name);
        }
      } else if (list) {
        for (const [name, value] of Object.entries(list)) res.setHeader(name, value);
      }
      return res;
    },
    write(chunk, encoding, callback) {
      if (mode === PASS) return original.write.call(res, chunk, encoding, callback);
      if (!ended && !finished && mode === HOLD && chunk != null) {
        hold(bytes(chunk, encoding));
        if (!begun) begin();
      }
      later(encoding, callback);
      if (!over || finished || mode === SEALED) return true;
      waiting = true;
      return false;
    },
    end(chunk, encoding, callback) {
      if (mode === PASS) return original.end.call(res, chunk, encoding, callback);
      if (ended || finished || mode === SEALED) {
        later(chunk, encoding, callback);
        return res;
      }
      // As Node's end does: the head first, through whatever wraps `writeHead` (on-headers:
      // a session's cookie, a response time), then the body.
      if (!headWritten) {
        ending = true;
        try {
          res.writeHead(res.statusCode);
        } finally {
          ending = false;
        }
      }
      if (chunk != null && typeof chunk !== "function") hold(bytes(chunk, encoding));
      later(chunk, encoding, callback);
      if (over) {
        finished = true;
        return res;
      }
      if (trailers !== null) {
        // Trailer fields, which a stored answer does not carry: the answer is recorded as
        // not kept and goes out as it is, trailers included (IDEM-STORE-5).
        finished = true;
        head = { status: res.statusCode, message: res.statusMessage, fields: Object.entries(res.getHeaders()) };
        resolve({ status: res.statusCode, headers: [], passThrough: true, trailed: true });
        return res;
      }
      ended = true;
      // Not those set before the app ran: they are this request's, not the answer's.
      const headers = answerFields(res.getHeaders(), new Map(before));
      statusMessage = res.statusMessage;
      clearHeaders(res);
      const body = Buffer.concat(chunks);
      resolve({ status: res.statusCode, headers, body: new Uint8Array(body.buffer, body.byteOffset, body.byteLength) });
      return res;
    },
  };
  Object.assign(res, ours);
  /** `res`'s own methods back; code that took the ones here (a wrapper mounted after this
   * one) reaches them through these. */
  const giveBack = () => {
    mode = PASS;
    Object.assign(res, original);
    if (head !== null) delete res.headersSent;
  };
  let released = false;
  const release = () => {
    if (released) return;
    released = true;
    giveBack();
    // Without the headers set since the capture began; those set before it stay.
    clearHeaders(res);
    for (const [name, value] of before) res.setHeader(name, value);
    if (ended) res.statusMessage = statusMessage;
  };
  const seal = () => {
    mode = SEALED;
    Object.assign(res, ours);
  };
  const flush = () => {
    released = true;
    giveBack();
    clearHeaders(res);
    for (const [name, value] of head.fields) res.setHeader(name, value);
    res.statusCode = head.status;
    res.statusMessage = head.message;
    let ready = true;
    for (const chunk of chunks.splice(0)) ready = res.write(chunk);
    if (trailers !== null) res.addTrailers(trailers);
    if (finished) res.end();
    // A source that waits for 'drain' gets it now, or from Node once the socket drains.
    else if (ready && waiting) res.emit("drain");
  };
  return { answer, release, seal, flush };
}

/** What the capture's methods do: hold, pass to `res`'s own, or nothing. */
const HOLD = 0;
const PASS = 1;
const SEALED = 2;

/** The bytes of a chunk the app writes, or Node's own error for one it would refuse. */
function bytes(chunk, encoding) {
  if (typeof chunk === "string") return Buffer.from(chunk, typeof encoding === "string" ? encoding : "utf8");
  if (chunk instanceof Uint8Array) return Buffer.from(chunk);
  const err = new TypeError('The "chunk" argument must be of type string or an instance of Buffer or Uint8Array');
  err.code = "ERR_INVALID_ARG_TYPE";
  throw err;
}

/** Node's check of a status code (`writeHead` throws the same). */
function checkStatus(status) {
  if (!Number.isInteger(status) || status < 100 || status > 999) {
    const err = new RangeError(`Invalid status code: ${status}`);
    err.code = "ERR_HTTP_INVALID_STATUS_CODE";
    throw err;
  }
}

/** A write callback, called as Node calls it: after the call that was given it. */
function later(...args) {
  const cb = args.find((f) => typeof f === "function");
  if (cb) queueMicrotask(cb);
}

/** The response closed before the app ended it: nobody is left to answer. */
function responseGone() {
  const err = prematureClose("the response");
  err.responseGone = true;
  return err;
}

function clearHeaders(res) {
  for (const name of res.getHeaderNames()) res.removeHeader(name);
}

/** Sends the engine's reply (the stored answer, a replay or a refusal). Its headers replace
 * those of the same names already set (by middleware before this one), a cookie those of
 * its cookie name (`cookiesUnder`); the rest stay. With
 * a capture, `res` is given back just before the reply is written and sealed just after,
 * with no await between: the app's late writes never reach the socket. */
export async function send(res, reply, idem, held) {
  // The app's own answer, past the size the store keeps: the rest goes out as it comes.
  if (reply.passThrough === true) return held.flush();
  const { status, fields, body } = await replyFields(idem, reply);
  held?.release();
  res.statusCode = status;
  // The engine's own reply is not the app's: none of the app's reason phrase either.
  if (reply.executed !== true) res.statusMessage = undefined;
  for (const [name, value] of fields) {
    // A cookie set before (a session's) stays beside the reply's, unless the reply sets it.
    if (name === "set-cookie") {
      const cookies = [value].flat().map(String);
      res.setHeader(name, [...cookiesUnder([res.getHeader(name) ?? []].flat().map(String), cookies), ...cookies]);
    } else res.setHeader(name, value);
  }
  // Set, not left to Node: once a content-length was removed (the capture clears the
  // headers), Node would send the answer chunked, and its replays would differ from it.
  if (status >= 200 && status !== 204 && status !== 304) res.setHeader("content-length", body.byteLength);
  res.end(Buffer.from(body.buffer, body.byteOffset, body.byteLength));
  held?.seal();
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
