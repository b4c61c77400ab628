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
  if (typeof from.arrayBuffer !== "function") return readChunks(idem, nodeChunks(from));
  // A Fetch body of a declared length within the limit is read at once: the runtime holds it
  // to that length. Its `body` is not asked for: Deno and Bun make a stream for it, and then
  // read through the stream.
  if (declared != null) return new Uint8Array(await from.arrayBuffer());
  const stream = from.body;
  if (stream === null) return EMPTY;
  return readChunks(idem, streamChunks(stream));
}

/** The chunks of a Fetch `ReadableStream`; `stop` cancels it. */
function streamChunks(stream) {
  const reader = stream.getReader();
  return { next: () => reader.read(), stop: () => reader.cancel().catch(() => {}) };
}

/** The chunks of a Node readable stream; `stop` unpipes it and lets the rest flow away. */
function nodeChunks(stream) {
  const chunks = stream[Symbol.asyncIterator]();
  return {
    next: () => chunks.next(),
    stop: () => {
      stream.unpipe?.();
      stream.resume();
      return chunks.return?.();
    },
  };
}

/** Reads `chunks` while the engine allows their total: the bytes, or the slot of its 413. */
async function readChunks(idem, chunks) {
  const parts = [];
  let total = 0;
  for (;;) {
    const { done, value } = await chunks.next();
    if (done) break;
    total += value.byteLength;
    const refused = idem.refuseBody(total);
    if (refused !== undefined) {
      await chunks.stop();
      return refused;
    }
    parts.push(value);
  }
  if (parts.length === 0) return EMPTY;
  // A plain Uint8Array, also over a Node Buffer.
  if (parts.length === 1) return new Uint8Array(parts[0].buffer, parts[0].byteOffset, parts[0].byteLength);
  const out = new Uint8Array(total);
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.byteLength;
  }
  return out;
}
