// Small helpers shared by the server and the stores (those the client needs too are in
// common.js, which needs no WebAssembly).
import { ReplyFlag, WriteFlag, wasmMemory } from "./idem_wasm.js";

/** A code point that is a surrogate: in a string, half of a pair whose other half is
 * missing. Text crosses into the module as UTF-8, where each such half becomes U+FFFD. */
const LONE_SURROGATE = /\p{Cs}/u;

/** Whether `text` crosses into the module as itself: no lone surrogate, which would become
 * U+FFFD there, the same as any other (so that two principals would be one). */
export const wellFormed = (text) => !LONE_SURROGATE.test(text);

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
  for (let i = 0; i < entries.length; i++) {
    const name = String(entries[i][0]).toLowerCase();
    const value = entries[i][1];
    if (Array.isArray(value)) for (const v of value) out.push(name, String(v));
    else if (value !== undefined) out.push(name, String(value));
  }
  return out;
}

// --- The layouts shared with the Rust layer (src/interop/layout.rs; test/boundary.test.mjs
// checks that both sides agree) ----------------------------------------------------------------

/** A list of strings as one string: each item as its length (UTF-16 code units), a colon and
 * the item. */
export function listText(items) {
  let text = "";
  for (let i = 0; i < items.length; i++) {
    const item = items[i];
    text += item.length + ":" + item;
  }
  return text;
}

/** The items of a list text. */
export function parseList(text) {
  const out = [];
  for (let i = 0; i < text.length; ) {
    const colon = text.indexOf(":", i);
    const start = colon + 1;
    i = start + Number(text.slice(i, colon));
    out.push(text.slice(start, i));
  }
  return out;
}

const textDecoder = new TextDecoder();

/** UTF-8 text. The runtimes' decoders beat building a string from the bytes in
 * JavaScript from about 16 bytes up, ASCII or not (Node 20, Deno and Bun: 80-130 ns for 64
 * bytes, against 300-360 ns); below that (a write's version numbers) plain ASCII is built
 * here, which spares workerd a call into its decoder. */
function utf8(bytes, start, end) {
  if (end - start < 16) {
    let text = "";
    for (let i = start; i < end; i++) {
      const c = bytes[i];
      if (c >= 0x80) return textDecoder.decode(bytes.subarray(start, end));
      text += String.fromCharCode(c);
    }
    return text;
  }
  return textDecoder.decode(bytes.subarray(start, end));
}

function u32(bytes, at) {
  return (bytes[at] | (bytes[at + 1] << 8) | (bytes[at + 2] << 16) | (bytes[at + 3] << 24)) >>> 0;
}

/** Reply bytes at `at` to `to`: `{ status, headers: [name, value, …], body, replayed }` (the
 * body a copy; `replayed` as the engine flags it). */
export function readReply(bytes, at = 0, to = bytes.length) {
  const end = at + 9 + u32(bytes, at + 5);
  return {
    status: u32(bytes, at + 1),
    headers: parseList(utf8(bytes, at + 9, end)),
    body: bytes.slice(end, to),
    replayed: (bytes[at] & ReplyFlag.Replayed) !== 0,
  };
}

let memory = null;
let view = null;

/** The module's memory, as bytes. */
function memoryView() {
  // The view is made again after the memory grew (the old buffer is then detached).
  if (view === null || view.byteLength === 0) {
    memory ??= wasmMemory();
    view = new Uint8Array(memory.buffer);
  }
  return view;
}

/** The reply an engine just wrote into the module's memory (`Engine.reply`), read in place;
 * null when the slot has none. */
export function takeReply(engine, slot) {
  const length = engine.reply(slot);
  if (length === 0) return null;
  const at = engine.outPtr();
  return readReply(memoryView(), at, at + length);
}

/** The context of the handler running in a slot (`Engine.context`), read in place:
 * `{ key, recovered, fence, leaseExpires, high, low }`, `high` and `low` the halves of the
 * attempt's identity (`attemptText` gives its text). */
export function takeContext(engine, slot) {
  const length = engine.context(slot);
  const at = engine.outPtr();
  const bytes = memoryView();
  const numbers = new DataView(bytes.buffer, bytes.byteOffset + at, 25);
  return {
    key: utf8(bytes, at + 25, at + length),
    recovered: bytes[at + 24] === 1,
    fence: numbers.getFloat64(0, true),
    leaseExpires: numbers.getFloat64(8, true),
    high: numbers.getUint32(20, true),
    low: numbers.getUint32(16, true),
  };
}

/** An attempt's identity from its halves: 64 bits as 16 hex digits, an identity to key by,
 * never a number to compute with. */
export function attemptText(high, low) {
  return high.toString(16).padStart(8, "0") + low.toString(16).padStart(8, "0");
}

/** Write bytes at `at` to `to` (src/interop/layout.rs): the write a store applies, `{ expect,
 * value, version, deadline, expires, storesResponse, inFlight }` (the value a copy). */
export function readWrite(bytes, at = 0, to = bytes.length) {
  const flags = bytes[at];
  const numbers = new DataView(bytes.buffer, bytes.byteOffset + at + 1, 16);
  const end = at + 21 + u32(bytes, at + 17);
  const head = parseList(utf8(bytes, at + 21, end));
  return {
    expect: flags & WriteFlag.Expect ? head[1] : null,
    value: flags & WriteFlag.Value ? bytes.slice(end, to) : null,
    version: head[0],
    deadline: numbers.getFloat64(0, true),
    expires: numbers.getFloat64(8, true),
    storesResponse: (flags & WriteFlag.StoresResponse) !== 0,
    inFlight: (flags & WriteFlag.InFlight) !== 0,
  };
}

/** The write bytes of `length` an engine just wrote at its `outPtr()`, read in place. */
function writtenWrite(engine, length) {
  const at = engine.outPtr();
  return readWrite(memoryView(), at, at + length);
}

/** The write of a request's `Apply` step. */
export const takeWrite = (engine, slot) => writtenWrite(engine, engine.takeWrite(slot));


/** The method of a store whose records live in the isolate that drives the request (a
 * Durable Object's own store): `store[CLAIM_IN_SLOT](engine, slot, key, now, step)` makes
 * the claim on the request's slot itself, from the `Claim` step just polled, and returns the
 * next step, or a promise of it. Not part of the store interface a host implements. */
export const CLAIM_IN_SLOT = Symbol("claimInSlot");

/** Statuses whose responses have no body (a Response refuses one). */
export const NULL_BODY_STATUS = new Set([101, 103, 204, 205, 304]);

/** The engine's reply `{ status, headers, body }` as a Fetch Response. */
export function toResponse(reply) {
  return new Response(NULL_BODY_STATUS.has(reply.status) ? null : reply.body, { status: reply.status, headers: pairsOf(reply.headers) });
}

/** A flat `[name, value, …]` list as the `[name, value]` pairs a Response takes: the
 * runtime copies them once, where a Headers object built first is checked and copied
 * twice. */
function pairsOf(flat) {
  const pairs = [];
  for (let i = 0; i < flat.length; i += 2) pairs.push([flat[i], flat[i + 1]]);
  return pairs;
}

import { rangeError } from "./errors.js";
export { rangeError };

const textEncoder = new TextEncoder();

/** The bytes of a body that `fetch` takes, when they can be had at once: text, a form's
 * parameters, or bytes (a view of the caller's buffer, not a copy); empty for no body;
 * undefined for a Blob, FormData or stream. */
export function bytesNow(body) {
  if (body == null) return new Uint8Array(0);
  if (typeof body === "string") return textEncoder.encode(body);
  if (body instanceof Uint8Array) return body;
  if (body instanceof ArrayBuffer) return new Uint8Array(body);
  if (ArrayBuffer.isView(body)) return new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
  if (body instanceof URLSearchParams) return textEncoder.encode(body.toString());
  return undefined;
}

/** Bytes given as data (`what`, for the error): text, bytes (an ArrayBuffer, a typed array
 * or a DataView), or nothing. Anything else is refused (IDEM-JS-1), never taken as no bytes:
 * a payload taken as empty would not be told from another, and a body stored empty would be
 * replayed so. */
export function givenBytes(body, what) {
  const bytes = bytesNow(body);
  if (bytes === undefined) throw rangeError("IDEM-JS-1", `${what} must be text or bytes (an ArrayBuffer, a typed array or a DataView)`);
  return bytes;
}

/** Request or response body bytes from the values `fetch` accepts. */
export async function bodyBytes(body) {
  // Blob, FormData, ReadableStream: let a Response serialise it.
  return bytesNow(body) ?? new Uint8Array(await new Response(body).arrayBuffer());
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
