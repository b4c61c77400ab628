// The request body, read for the fingerprint: one reader for every adapter, a Fetch
// `Request` (withIdempotency, Hono) or a Node request stream (Express). The limit and the 413
// are the engine's: each size is put to `Idempotency#refuseBody`, which answers with the slot
// of the core's refusal (IDEM-LIMIT-1).

const EMPTY = new Uint8Array(0);

/**
 * Reads a request body while the engine allows its size. `declared` is its `Content-Length`
 * (null or undefined without one); `from` is a Fetch `Request` or a Node readable stream.
 * Resolves to the bytes, or to the slot that answers 413: at once for a declared length past
 * the limit, before a byte is read; otherwise as soon as a chunk goes past it, the rest left
 * unread, so that an endless upload cannot fill the memory.
 */
export async function readBody(idem, declared, from) {
  if (declared != null) {
    const refused = idem.refuseBody(Number(declared));
    if (refused !== undefined) return refused;
  }
  if (typeof from.arrayBuffer !== "function") return readNode(idem, from);
  // A Fetch body of a declared length within the limit is read at once: the runtime holds it
  // to that length. Its `body` is not asked for: Deno and Bun make a stream for it, and then
  // read through the stream.
  if (declared != null) return new Uint8Array(await from.arrayBuffer());
  const stream = from.body;
  if (stream === null) return EMPTY;
  return readStream(idem, stream);
}

/**
 * Reads a Node readable stream by its events while the engine allows its total: the bytes,
 * or the slot of its 413, the rest then left to flow away unread. Events, not the stream's
 * async iterator: the iterator's promise per chunk and its end cost an Express app about 20
 * µs of CPU per request (`node bench/http.mjs`). A stream that closes before its end (the
 * client went away mid-body) or fails rejects, so nothing runs on part of a body.
 */
function readNode(idem, stream) {
  return new Promise((resolve, reject) => {
    if (stream.readableEnded) return resolve(EMPTY);
    if (stream.destroyed) return reject(prematureClose());
    const parts = [];
    let total = 0;
    const onData = (chunk) => {
      total += chunk.byteLength;
      let refused;
      try {
        refused = idem.refuseBody(total);
      } catch (err) {
        // Thrown from an event handler, it would be the process's uncaught exception.
        settle();
        stream.resume();
        reject(err);
        return;
      }
      if (refused === undefined) {
        parts.push(chunk);
        return;
      }
      settle();
      stream.unpipe?.();
      stream.resume();
      resolve(refused);
    };
    const onEnd = () => {
      settle();
      resolve(joined(parts, total));
    };
    const onError = (err) => {
      settle();
      reject(err);
    };
    const onClose = () => {
      settle();
      reject(prematureClose());
    };
    const settle = () => {
      stream.off("data", onData);
      stream.off("end", onEnd);
      stream.off("error", onError);
      stream.off("close", onClose);
    };
    stream.on("data", onData);
    stream.on("end", onEnd);
    stream.on("error", onError);
    stream.on("close", onClose);
    // A 'data' listener does not start a stream that something paused before.
    stream.resume();
  });
}

function prematureClose() {
  const err = new Error("the request body ended before it was complete");
  err.code = "ERR_STREAM_PREMATURE_CLOSE";
  return err;
}

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
