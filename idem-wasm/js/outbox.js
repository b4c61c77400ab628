// The client's module as `idempotentFetch` sees it. The module has one entry point,
// `call(op, input)` (client-module.js): the operation's number (ClientOp) and its arguments
// as tagged values (Wire) in, its answer's values out; src/interop/call.rs defines both, and
// what each operation takes and answers. This file encodes the arguments, decodes the
// answers, and offers the operations of an outbox entry as a small class, held as its
// persisted bytes (nothing lives in the module between calls); counter.js offers the counter
// numbering's.
import { random32 } from "./common.js";
import { rangeError } from "./errors.js";
import * as ClientOp from "./client-codes/op.js";
import * as Names from "./client-codes/names.js";
import * as Wire from "./client-codes/wire.js";
import { call } from "./client-module.js";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** The values as the module reads them: undefined and null absent, numbers and booleans as
 * numbers, strings as text, Uint8Arrays as bytes. */
export function encode(values) {
  const items = values.map((v) => (typeof v === "string" ? encoder.encode(v) : v));
  let size = 0;
  for (const v of items) size += v == null ? 1 : v instanceof Uint8Array ? 5 + v.length : 9;
  const out = new Uint8Array(size);
  const view = new DataView(out.buffer);
  let at = 0;
  items.forEach((v, i) => {
    if (v == null) {
      out[at++] = Wire.Absent;
    } else if (v instanceof Uint8Array) {
      out[at] = typeof values[i] === "string" ? Wire.Text : Wire.Bytes;
      view.setUint32(at + 1, v.length, true);
      out.set(v, at + 5);
      at += 5 + v.length;
    } else {
      out[at] = Wire.Number;
      view.setFloat64(at + 1, Number(v), true);
      at += 9;
    }
  });
  return out;
}

/** An answer's values (absent ones undefined), or the RangeError it refuses with. */
export function decode(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const refused = bytes[0] === Wire.Error;
  const values = [];
  for (let at = refused ? 1 : 0; at < bytes.length; ) {
    const tag = bytes[at++];
    if (tag === Wire.Number) {
      values.push(view.getFloat64(at, true));
      at += 8;
    } else if (tag === Wire.Absent) {
      values.push(undefined);
    } else {
      const b = bytes.subarray(at + 4, (at += 4 + view.getUint32(at, true)));
      values.push(tag === Wire.Text ? decoder.decode(b) : b.slice());
    }
  }
  if (refused) throw rangeError(values[0], values[1]);
  return values;
}

/** Runs operation `op` with `args`: the values of its answer. */
export function run(op, ...args) {
  return decode(call(op, encode(args)));
}

/** What the full module offers: its `call` (the counter numbering and the payload digest,
 * ClientOp.Digest, run in it) and `withSequence` (counter.js, bundled with it). Set by the
 * entry (`fullModule`): at hand in every entry but the browsers', whose module has neither,
 * and which load the full one when first needed. */
let full = () => Promise.reject(new Error("no full client module"));

/** How to get the full module: `load` resolves to its `call` and `withSequence`, and runs
 * once, when first needed (again after it failed). */
export function fullModule(load) {
  let loaded;
  full = () =>
    (loaded ??= load().catch((err) => {
      // Not kept: the next operation that needs the module tries to load it again.
      loaded = undefined;
      throw err;
    }));
}

/** The full module's `call` and `withSequence` (see `fullModule`). */
export function fullApi() {
  return full();
}

/** Runs operation `op` of the full module with `args`: the values of its answer. */
export async function runFull(op, ...args) {
  return decode((await full()).call(op, encode(args)));
}

/** The 32-byte digest of a payload: the runtime's SHA-256 (WebCrypto) of the message the
 * module lays out, or the full module's digest where there is no WebCrypto (a page that is
 * not a secure context). */
export async function payloadDigest(method, url, body) {
  const subtle = globalThis.crypto?.subtle;
  if (subtle === undefined) return (await runFull(ClientOp.Digest, method, url, body))[0];
  const [message] = run(ClientOp.PayloadMessage, method, url, body);
  return new Uint8Array(await subtle.digest("SHA-256", message));
}

/** A status document's values as the module reads them: the value at each of its members
 * (`Names.statusMembers`), as JSON text (undefined where there is none; all undefined when
 * the text is not JSON or there is none). The document is parsed here, by the runtime's own parser. */
export function statusValues(text) {
  let doc;
  try {
    doc = JSON.parse(text);
  } catch {}
  const member = (value, name) => (value !== null && typeof value === "object" && !Array.isArray(value) && Object.hasOwn(value, name) ? value[name] : undefined);
  return Names.statusMembers.map((path) => JSON.stringify(path.reduce(member, doc)));
}

/**
 * One logical request: the core's outbox entry, as its bytes, with its retry options (an
 * array of four, see `retryArgs` in client.js) and what the module says of it: `key`,
 * `state` (OutboxState), `outcome` (FetchOutcome, undefined while it is not over),
 * `attempts` and `lastStatus`. The methods that report a result answer the next step:
 * `{ kind, outcome, status, reason }` (NextKind, FetchOutcome).
 */
export class Outbox {
  constructor(view, retry) {
    this.retry = retry;
    this.view(view);
  }

  /** A new entry for `key` and the payload `digest`. */
  static create(key, digest, retry) {
    return new Outbox(run(ClientOp.Create, key, digest, ...retry), retry);
  }

  /** A persisted entry (IDEM-CLIENT-6 for bytes that are not one). */
  static fromBytes(bytes, retry) {
    return new Outbox(run(ClientOp.Restore, bytes, ...retry), retry);
  }

  view([bytes, key, state, outcome, attempts, lastStatus]) {
    Object.assign(this, { bytes, key, state, outcome, attempts, lastStatus });
  }

  nextSend(now) {
    return run(ClientOp.NextSend, this.bytes, now)[0];
  }

  nextAsk(now) {
    return run(ClientOp.NextAsk, this.bytes, now)[0];
  }

  checkPayload(digest) {
    run(ClientOp.CheckPayload, this.bytes, digest);
  }

  send(now, digest) {
    this.view(run(ClientOp.Send, this.bytes, now, digest));
  }

  markProcessed() {
    this.view(run(ClientOp.MarkProcessed, this.bytes));
  }

  /** Reports a response: its status, `Retry-After` in seconds, its problem `type`, and
   * whether the host marked it as not processed. */
  onResponse(now, status, retryAfter, problemType, replayed) {
    return this.#report(ClientOp.OnResponse, now, status, retryAfter, problemType, replayed);
  }

  /** Reports a send without a response: `lost` when it may have reached the server. */
  onNetworkError(now, lost) {
    return this.#report(ClientOp.OnNetworkError, now, lost);
  }

  /** Reports the answer to a status query: the status document's text (undefined when the
   * answer was none), and whether the payload is at hand to send again. */
  onStatus(now, document, canResend) {
    return this.#report(ClientOp.OnStatus, now, ...statusValues(document), canResend);
  }

  #report(op, now, ...result) {
    const [kind, outcome, status, reason, ...view] = run(op, this.bytes, ...this.retry, now, random32(), random32(), ...result);
    this.view(view);
    return { kind, outcome, status, reason };
  }
}
