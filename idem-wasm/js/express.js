// `idem/express`: Idempotency-Key semantics as Express middleware (Express 4 and 5). No
// lifecycle of its own: the request goes through `Idempotency#handle` (the engine's request
// machine), and the rest of the Express chain runs as its handler, with the response it
// writes captured, stored, and then sent.
//
//   app.use("/api", idempotency({ store, principal: (req) => req.user.id }));
//
// Mount it before body parsers: it reads the raw body (up to the engine's limit, 413
// beyond) for the fingerprint, and leaves it as `req.rawBody`, with `req.body` parsed from
// JSON when the content type says JSON (so that express.json() after it has nothing to do).
import { Idempotency } from "idem";
import { rangeError } from "./errors.js";

const EMPTY = new Uint8Array(0);

/**
 * Express middleware. `options` are `withIdempotency`'s (a store and a principal are
 * required; `principal` is called with the Express request), plus `skip(req)`, a predicate
 * for requests to let through unguarded. Refusals are problem+json, or the Response that
 * `options.problem(problem, reply)` returns.
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
    serve(idem, skip, req, res, next).catch(next);
  };
}

async function serve(idem, skip, req, res, next) {
  if (skip !== undefined && (await skip(req))) return next();
  const headers = { get: (name) => req.get(name) ?? null };
  const key = idem.keyOf(req.get(idem.keyHeader) ?? null, headers);
  if (!idem.protects(req.method, key !== null)) return next();
  const length = req.get("content-length");
  const tooLarge = length === undefined ? undefined : idem.refuseBody(Number(length));
  if (tooLarge !== undefined) return send(res, await idem.serve(tooLarge, (reply) => reply), idem);
  const body = await readBody(req, idem);
  if (typeof body === "number") return send(res, await idem.serve(body, (reply) => reply), idem);
  req.rawBody = body;
  if (/^application\/([\w.+-]+\+)?json\b/i.test(req.get("content-type") ?? "") && body.byteLength > 0) {
    try {
      req.body = JSON.parse(new TextDecoder().decode(body));
    } catch {
      // The app's own parser reports it (the fingerprint took the bytes as they are).
      req.body = undefined;
    }
  }
  // Body parsers skip a request whose body was read.
  req._body = true;
  const reply = await idem.handle(
    {
      req,
      method: req.method,
      target: req.originalUrl,
      route: undefined,
      key,
      lowWater: req.get("idempotency-low-water"),
      contentType: req.get("content-type"),
      // Node's header record (lower-case names); only the fingerprint headers are read.
      headers: req.headers,
      body,
    },
    (context) => {
      req.idempotency = context;
      const captured = capture(res);
      next();
      return captured;
    },
  );
  send(res, reply, idem);
}

/** Reads the request body while the engine allows its size: the bytes, or (the rest left
 * unread) the slot that answers 413. */
async function readBody(req, idem) {
  const chunks = [];
  let total = 0;
  for await (const chunk of req) {
    total += chunk.byteLength;
    const refused = idem.refuseBody(total);
    if (refused !== undefined) {
      req.unpipe?.();
      req.resume();
      return refused;
    }
    chunks.push(chunk);
  }
  if (chunks.length === 0) return EMPTY;
  const all = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, total);
  return new Uint8Array(all.buffer, all.byteOffset, all.byteLength);
}

/** Holds back what the app writes to `res` and resolves to it as `{ status, headers, body }`
 * once it ends; nothing reaches the socket until the outcome is stored. */
function capture(res) {
  return new Promise((resolve) => {
    const chunks = [];
    const original = { write: res.write, end: res.end, writeHead: res.writeHead };
    const bytes = (chunk, encoding) =>
      typeof chunk === "string" ? Buffer.from(chunk, typeof encoding === "string" ? encoding : "utf8") : Buffer.from(chunk);
    res.writeHead = function writeHead(status, reason, headers) {
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
      if (chunk != null) chunks.push(bytes(chunk, encoding));
      const cb = typeof encoding === "function" ? encoding : callback;
      if (cb) queueMicrotask(cb);
      return true;
    };
    res.end = function end(chunk, encoding, callback) {
      if (chunk != null && typeof chunk !== "function") chunks.push(bytes(chunk, encoding));
      Object.assign(res, original);
      const headers = [];
      for (const [name, value] of Object.entries(res.getHeaders())) {
        for (const v of Array.isArray(value) ? value : [value]) headers.push([name, String(v)]);
      }
      for (const name of res.getHeaderNames()) res.removeHeader(name);
      const body = Buffer.concat(chunks);
      resolve({ status: res.statusCode, headers, body: new Uint8Array(body.buffer, body.byteOffset, body.byteLength) });
      const cb = [chunk, encoding, callback].find((f) => typeof f === "function");
      if (cb) queueMicrotask(cb);
      return res;
    };
  });
}

/** Sends the engine's reply (the stored answer, a replay or a refusal). */
async function send(res, reply, idem) {
  // The engine's refusals go through the problem hook; replays and the app's answers never do.
  const mapped = idem.mappedRefusal(reply);
  if (mapped !== undefined) {
    reply = { status: mapped.status, headers: [...mapped.headers].flat(), body: new Uint8Array(await mapped.arrayBuffer()) };
  }
  res.statusCode = reply.status;
  for (let i = 0; i < reply.headers.length; i += 2) {
    const name = reply.headers[i];
    // Express's own length and encoding are recomputed from the body.
    if (name === "content-length" || name === "transfer-encoding") continue;
    const existing = res.getHeader(name);
    if (existing === undefined) res.setHeader(name, reply.headers[i + 1]);
    else res.setHeader(name, [].concat(existing, reply.headers[i + 1]));
  }
  res.end(Buffer.from(reply.body.buffer, reply.body.byteOffset, reply.body.byteLength));
}
