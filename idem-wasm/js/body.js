// The bodies idem reads. The request body, for the fingerprint: one reader for every adapter,
// a Fetch `Request` (withIdempotency, Hono) or a Node request stream (Express). The limit and
// the 413 are the engine's: each size is put to `Idempotency#refuseBody`, which answers with
// the slot of the core's refusal (IDEM-LIMIT-1). And an answer's body, read no further than
// the store keeps, and the rest of it sent on as it comes (IDEM-STORE-5).

import { prematureClose } from "./errors.js";

const EMPTY = new Uint8Array(0);
const textEncoder = new TextEncoder();

/**
 * Reads a request body while the engine allows its size. `declared` is its `Content-Length`
 * (null or undefined without one); `from` is a Fetch `Request` or a Node readable stream.
 * Resolves to the bytes, or to the slot that answers 413: at once for a declared length past
 * the limit, before a byte is read; otherwise as soon as a chunk goes past it, the rest left
 * unread, so that an endless upload cannot fill the memory.
 *
 * `giveBack` (Node streams only) leaves what was read in the stream, for the application's
 * own parsers to read after it as if nothing had: `true` whether the body was read whole or
 * refused, `"refused"` only when it was refused (a body read whole is then consumed).
 */
export async function readBody(idem, declared, from, giveBack = false) {
  if (declared != null) {
    const refused = idem.refuseBody(Number(declared));
    if (refused !== undefined) return refused;
  }
  if (typeof from.arrayBuffer !== "function") return readNode(idem, from, giveBack);
  // A Fetch body of a declared length within the limit is read at once: the runtime holds it
  // to that length. Its `body` is not asked for: Deno and Bun make a stream for it, and then
  // read through the stream.
  if (declared != null) return new Uint8Array(await from.arrayBuffer());
  const stream = from.body;
  if (stream === null) return EMPTY;
  return readStream(idem, stream);
}

/** For a Node request whose body was refused before it was read whole (a 413 on a declared
 * length, or on a body that went past the limit): its connection closes once the answer is
 * sent (`Connection: close` on Node's response `res`), so that the rest of the upload,
 * however long, is not read and dropped after it to keep the connection (IDEM-LIMIT-1). */
export function closeUnread(req, res) {
  if (!req.complete) res.setHeader("connection", "close");
}

/**
 * Reads a Node readable stream while the engine allows its total: the bytes, or the slot of
 * its 413. In paused mode, by its 'readable' events and `read()`, as the stream's async
 * iterator does, without the iterator's promise for each chunk and for its end (which cost
 * an Express app about 20 µs of CPU per request, `node bench/http.mjs`). Text chunks (a
 * stream given an encoding) are read as the bytes of that encoding; object chunks are
 * refused. A stream that fails, or closes before its end (the client went away mid-body),
 * rejects, so nothing runs on part of a body.
 *
 * Once the read is over before the end (a refusal, a failure), a later error of the stream
 * is nobody's to handle and is swallowed. The rest of a refused body: the request's own
 * stream drains until its connection closes after the answer (`closeUnread`), so that the
 * client reads the answer rather than a reset; any other stream (a decompressor a hook put
 * in front of the request) is destroyed rather than run to its end.
 *
 * What is given back (`giveBack`) is put back in front of the stream with `unshift`, which
 * a stream takes until its 'end' has been emitted: a request is read whole once it is
 * `complete` and nothing is left to read, and the body goes back in the same turn, before
 * the stream could emit 'end'. The stream is then paused, its body waiting for the next
 * reader.
 */
function readNode(idem, stream, giveBack) {
  return new Promise((resolve, reject) => {
    if (stream.readableEnded) return resolve(EMPTY);
    if (stream.destroyed) return reject(stream.errored ?? prematureClose("the request body"));
    const parts = [];
    let total = 0;
    const settle = () => {
      stream.off("readable", onReadable);
      stream.off("end", onEnd);
      stream.off("error", onError);
      stream.off("close", onClose);
    };
    const abandon = () => {
      settle();
      stream.on("error", ignore);
      if (stream.socket === undefined) return stream.destroy();
      stream.unpipe?.();
      stream.resume();
    };
    const onReadable = () => {
      for (let chunk = stream.read(); chunk !== null; chunk = stream.read()) {
        if (typeof chunk === "string") chunk = Buffer.from(chunk, stream.readableEncoding ?? "utf8");
        else if (!(chunk instanceof Uint8Array)) {
          abandon();
          return reject(new TypeError("the request body stream gives objects, not bytes"));
        }
        total += chunk.byteLength;
        let refused;
        try {
          refused = idem.refuseBody(total);
        } catch (err) {
          // Thrown from an event handler, it would be the process's uncaught exception.
          abandon();
          return reject(err);
        }
        parts.push(chunk);
        if (refused !== undefined) {
          if (!giveBack) abandon();
          else {
            putBack();
            // The rest may fail before anyone reads it: nobody's to handle then.
            stream.on("error", ignore);
          }
          return resolve(refused);
        }
      }
      // Read whole: a request that is complete has nothing more to push.
      if (giveBack === true && stream.complete === true) resolve(putBack());
    };
    // What was read, back in front of the stream; resolves to the same bytes.
    const putBack = () => {
      settle();
      const bytes = joined(parts, total);
      if (total > 0) stream.unshift(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength));
      return bytes;
    };
    const onEnd = () => {
      settle();
      resolve(joined(parts, total));
    };
    const onError = (err) => {
      settle();
      stream.on("error", ignore);
      reject(err);
    };
    const onClose = () => {
      settle();
      reject(stream.errored ?? prematureClose("the request body"));
    };
    stream.on("readable", onReadable);
    stream.on("end", onEnd);
    stream.on("error", onError);
    stream.on("close", onClose);
  });
}

function ignore() {}

/** Reads a Fetch `ReadableStream` while the engine allows its total: the bytes, or the slot
 * of its 413, the stream then cancelled. */
async function readStream(idem, stream) {
  const reader = stream.getReader();
  const parts = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.byteLength;
    const refused = idem.refuseBody(total);
    if (refused !== undefined) {
      await reader.cancel().catch(() => {});
      return refused;
    }
    parts.push(value);
  }
  return joined(parts, total);
}

/** Reads an answer's body up to `limit` bytes (IDEM-STORE-5), a chunk per call of `next`
 * (a Fetch reader's `read`, an async iterator's `next`): `{ bytes }` when it ends within the
 * limit, or `{ held }`, the chunks read so far, once it goes past it (the rest is `next`'s to
 * give). Text chunks (a Node stream given an encoding) are read as their UTF-8 bytes. */
export async function readAnswer(next, limit) {
  const parts = [];
  let total = 0;
  for (;;) {
    const { done, value } = await next();
    if (done) return { bytes: joined(parts, total) };
    const chunk = answerBytes(value);
    parts.push(chunk);
    total += chunk.byteLength;
    if (total > limit) return { held: parts };
  }
}

/** What `readAnswer` held of a body, then the rest of it: a stream that reads the next chunk
 * when its reader asks for one, so that the body is produced at the pace the client reads,
 * and is cancelled when the client leaves. */
export function passOn(held, reader) {
  let next = 0;
  return new ReadableStream(
    {
      async pull(controller) {
        if (next < held.length) {
          controller.enqueue(held[next]);
          held[next++] = undefined;
          return;
        }
        const { done, value } = await reader.read();
        if (done) controller.close();
        else controller.enqueue(answerBytes(value));
      },
      cancel(reason) {
        return reader.cancel(reason);
      },
    },
    { highWaterMark: 0 },
  );
}

/** A chunk of an answer as bytes: text (a Node stream given an encoding) as its UTF-8. */
function answerBytes(value) {
  return typeof value === "string" ? textEncoder.encode(value) : value;
}

/** The chunks read, as one plain Uint8Array (also over a Node Buffer). */
function joined(parts, total) {
  if (parts.length === 0) return EMPTY;
  if (parts.length === 1) return new Uint8Array(parts[0].buffer, parts[0].byteOffset, parts[0].byteLength);
  const out = new Uint8Array(total);
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.byteLength;
  }
  return out;
}
