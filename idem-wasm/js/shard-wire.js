// The messages between a worker and an `IdempotencyShard`, through the object's `fetch`: a
// claim, a compare-and-set of a record (apply) and a read (load), each a POST to a path of
// the object with its fields in headers and its bytes in the body, and an error answered with
// its code. Both ends of each message are here, what one side writes next to what the other
// reads of it: `DurableObjectStore` (shard-store.js) sends them, `IdempotencyShard#fetch`
// (shard.js) answers them.

import { rangeError } from "./errors.js";

/** The origin of the object's URLs: never resolved, a stub's fetch goes to its object. */
export const SHARD_ORIGIN = "https://idem-shard.invalid";
/** The paths of the three messages. */
export const CLAIM = "/claim";
export const APPLY = "/apply";
export const LOAD = "/load";

/** A claim: the request's ticket (encoded by the engine), the engine's options as text, the
 * time and the two halves of the nonce. */
export function claimRequest(ticket, optionsText, now, hi, lo) {
  const headers = { "x-idem-options": encodeURIComponent(optionsText), "x-idem-now": String(now), "x-idem-nonce": `${hi}.${lo}` };
  return { path: CLAIM, headers, body: ticket };
}

/** A claim's fields, as the object reads them (the ticket is the body). */
export function readClaim(h) {
  const [hi, lo] = (h.get("x-idem-nonce") ?? "0.0").split(".").map(Number);
  return { optionsText: decodeURIComponent(h.get("x-idem-options") ?? "{}"), now: millis(h, "x-idem-now"), hi, lo };
}

/** A time a message carries, in milliseconds: a number, never negative. A missing or bad one
 * is refused (IDEM-JS-2): read as 0, a claim's lease would have ended before it began, and a
 * deadline that is not a number would never come. */
function millis(h, name) {
  const text = h.get(name) ?? "";
  const n = Number(text);
  if (text.trim() === "" || !Number.isFinite(n) || n < 0) {
    throw rangeError("IDEM-JS-2", `the shard message's ${name} is not a time in milliseconds: "${text}"`);
  }
  return n;
}

/** The answer to a claim: the bytes the engine reads. */
export function claimed(bytes) {
  return new Response(bytes, { headers: { "content-type": "application/octet-stream" } });
}

export async function readClaimed(response) {
  return new Uint8Array(await response.arrayBuffer());
}

/** A compare-and-set of `key`'s record: a write as the engine asked for it (`expect`, the
 * version it replaces or null; `value`, null to delete; `version`; `deadline`; `expires`). */
export function applyRequest(key, write, now) {
  const headers = {
    "x-idem-key": encodeURIComponent(key),
    "x-idem-version": write.version,
    "x-idem-deadline": String(write.deadline),
    "x-idem-now": String(now),
  };
  if (Number.isFinite(write.expires)) headers["x-idem-expires"] = String(write.expires);
  if (write.expect !== null) headers["x-idem-expect"] = write.expect;
  if (write.value === null) headers["x-idem-delete"] = "1";
  return { path: APPLY, headers, body: write.value ?? undefined };
}

/** A compare-and-set as the object reads it, with its body's bytes. */
export function readApply(h, body) {
  const write = {
    expect: h.get("x-idem-expect"),
    value: h.get("x-idem-delete") === "1" ? null : body,
    version: h.get("x-idem-version") ?? "",
    deadline: millis(h, "x-idem-deadline"),
    expires: h.has("x-idem-expires") ? millis(h, "x-idem-expires") : undefined,
  };
  return { key: readKey(h), write, now: millis(h, "x-idem-now") };
}

/** The answer to a compare-and-set: whether it was applied. */
export function applied(ok) {
  return new Response(ok ? "applied" : "conflict");
}

export async function readApplied(response) {
  return (await response.text()) === "applied";
}

/** A read of `key`'s record. */
export function loadRequest(key) {
  return { path: LOAD, headers: { "x-idem-key": encodeURIComponent(key) } };
}

/** The key of a compare-and-set or a read. */
export function readKey(h) {
  return decodeURIComponent(h.get("x-idem-key") ?? "");
}

/** The answer to a read: the record's value and version, or 404 for none. */
export function loaded(record) {
  if (record === null) return new Response(null, { status: 404 });
  return new Response(record.value, { headers: { "x-idem-version": record.version } });
}

export async function readLoaded(response) {
  if (response.status === 404) return null;
  return { version: response.headers.get("x-idem-version"), value: new Uint8Array(await response.arrayBuffer()) };
}

/** An error the object met, answered with its code: 400 for one with a code (a refusal), 500
 * otherwise. */
export function failure(err) {
  return new Response(String(err?.message ?? err), { status: err?.code ? 400 : 500, headers: { "x-idem-code": err?.code ?? "" } });
}

/** The error an answer of `failure` carries; a store failure (`IDEM-STORE-4`) when it has no
 * code. */
export async function failureOf(response) {
  const err = new Error(`idempotency shard: ${await response.text()}`);
  err.code = response.headers.get("x-idem-code") || "IDEM-STORE-4";
  return err;
}
