// Small helpers shared by the server, the stores and the client.

/** 64 random bits as two u32 halves, from a pool refilled with crypto.getRandomValues.
 *
 * The pool is filled on first use, never at module load: Cloudflare Workers refuse to
 * generate random values outside a request handler. */
let pool = null;
let next = 0;
export function randomHalves() {
  if (pool === null || next >= pool.length) {
    pool ??= new Uint32Array(256);
    crypto.getRandomValues(pool);
    next = 0;
  }
  const hi = pool[next];
  const lo = pool[next + 1];
  next += 2;
  return [hi, lo];
}

/** A header list (Headers, an array of pairs, or a record) as a flat [name, value, …] list
 * with lowercase names. Set-Cookie values stay separate. */
export function flatHeaders(headers) {
  const out = [];
  if (headers == null) return out;
  if (typeof headers.getSetCookie === "function" && typeof headers.forEach === "function") {
    headers.forEach((value, name) => {
      if (name !== "set-cookie") out.push(name, value);
    });
    for (const c of headers.getSetCookie()) out.push("set-cookie", c);
    return out;
  }
  if (typeof headers.forEach === "function" && !Array.isArray(headers)) {
    headers.forEach((value, name) => out.push(name.toLowerCase(), String(value)));
    return out;
  }
  const entries = Array.isArray(headers) ? headers : Object.entries(headers);
  for (const [name, value] of entries) {
    if (Array.isArray(value)) for (const v of value) out.push(String(name).toLowerCase(), String(v));
    else if (value !== undefined) out.push(String(name).toLowerCase(), String(value));
  }
  return out;
}

/** A flat [name, value, …] list as the pairs a Response accepts. */
export function pairsOf(flat) {
  const out = new Array(flat.length >> 1);
  for (let i = 0; i < out.length; i++) out[i] = [flat[2 * i], flat[2 * i + 1]];
  return out;
}

/** A RangeError with a stable code (a requirement ID from spec/requirements.toml). */
export function rangeError(code, message) {
  const e = new RangeError(message);
  e.code = code;
  return e;
}

/** Resolves after `ms` milliseconds, or at once when the signal aborts. */
export function sleep(ms, signal) {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

const textEncoder = new TextEncoder();

/** Request or response body bytes from the values `fetch` accepts. */
export async function bodyBytes(body) {
  if (body == null) return new Uint8Array(0);
  if (typeof body === "string") return textEncoder.encode(body);
  if (body instanceof Uint8Array) return body;
  if (body instanceof ArrayBuffer) return new Uint8Array(body);
  if (ArrayBuffer.isView(body)) return new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
  if (body instanceof URLSearchParams) return textEncoder.encode(body.toString());
  // Blob, FormData, ReadableStream: let a Response serialise it.
  return new Uint8Array(await new Response(body).arrayBuffer());
}

/** The error a store throws when it cannot take another key (IDEM-STORE-3): the claim is
 * refused with 503 store-full and nothing runs. */
export class StoreFullError extends Error {
  constructor(message = "idempotency store full") {
    super(message);
    this.name = "StoreFullError";
    this.code = "IDEM-STORE-3";
  }
}
