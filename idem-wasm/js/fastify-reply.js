// A Fastify reply between an app and the engine: the bytes of a payload on its way out, and
// the engine's replies set on the reply with their headers. Shared by idem/fastify and
// idem/nestjs on the Fastify platform.

/** The bytes of a payload on its way out: a string, a Buffer, a stream, or nothing. */
export async function bytesOf(payload) {
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
  const mapped = idem.mappedRefusal(answer);
  if (mapped !== undefined) {
    answer = { status: mapped.status, headers: [...mapped.headers].flat(), body: new Uint8Array(await mapped.arrayBuffer()) };
  }
  const fields = new Map();
  for (let i = 0; i < answer.headers.length; i += 2) {
    const name = answer.headers[i].toLowerCase();
    // The length is Fastify's to set from the body; the framing is the connection's.
    if (name === "content-length" || name === "transfer-encoding") continue;
    const values = fields.get(name);
    if (values === undefined) fields.set(name, [answer.headers[i + 1]]);
    else values.push(answer.headers[i + 1]);
  }
  reply.code(answer.status);
  for (const [name, values] of fields) reply.header(name, values.length === 1 ? values[0] : values);
  return Buffer.from(answer.body.buffer, answer.body.byteOffset, answer.body.byteLength);
}
