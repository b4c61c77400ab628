// The client side: `idempotentFetch(input, init, options)`. The retry decisions are the
// core's outbox entry (idem-core's client state machine, compiled to WebAssembly, reached through
// outbox.js): this file sends, reports each result, waits as told, and persists the entry
// between sends; client-request.js checks the options and makes the request it sends from.
//
// One file for one function: the send loop of `idempotentFetch`, its waits, its
// persistence and its reconciliation share the entry and the options, and read in order.
// Calls that share an entry are joined in client-join.js.
import { sleep } from "./common.js";
import { rangeError } from "./errors.js";
import * as ClientOp from "./client-codes/op.js";
import * as FetchOutcome from "./client-codes/fetch-outcome.js";
import * as NextKind from "./client-codes/next-kind.js";
import * as OutboxState from "./client-codes/outbox-state.js";
import * as Names from "./client-codes/names.js";
import { Outbox, fullApi, payloadDigest, run } from "./outbox.js";
import { abortReason, prepare, retryArgs } from "./client-request.js";
import { joinOrLead } from "./client-join.js";

/** Network errors that mean nothing left the client: the connection was never opened. */
const NOT_SENT_CODES = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "ENETUNREACH", "EHOSTUNREACH"]);

function networkErrorWasLost(err) {
  for (let e = err; e != null; e = e.cause) {
    if (NOT_SENT_CODES.has(e.code)) return false;
  }
  return true;
}

/** `Retry-After` in seconds: delta-seconds or an HTTP date. */
function retryAfterSeconds(value, now) {
  if (value === null) return undefined;
  const v = value.trim();
  if (/^\d+$/.test(v)) return +v;
  const date = Date.parse(v);
  // NaN, a value that is no date, is not above 0.
  return date > 0 ? Math.max(0, Math.ceil((date - now) / 1000)) : undefined;
}

/** An answer's media type: lowercase, without its parameters. */
function mediaType(response) {
  return (response.headers.get("content-type") ?? "").split(";")[0].trim().toLowerCase();
}

async function problemType(response) {
  if (mediaType(response) !== Names.problemMediaType) return undefined;
  try {
    const body = await response.clone().json();
    return typeof body?.type === "string" ? body.type : undefined;
  } catch {
    return undefined;
  }
}

/** Lets go of an answer the call does not return, unread: a body that comes slowly or never
 * ends holds nothing up. */
function cancel(response) {
  response.body?.cancel().catch(() => {});
}

/** Request fields that describe a body (`Content-Type`, `-Length`, `-Encoding`, `-Digest` and
 * the other `Content-` fields, and `Digest`): a status query, which has none, leaves them out. */
const BODY_FIELD = /^(content-|digest$)/;

/**
 * Asks the server what became of `entry`'s key with a settling status query (IDEM-CLIENT-8):
 * a `GET` of the request's URL with its headers (credentials, the principal's) and options,
 * its key and `Idempotency-Status`. Reports the answer to the entry and resolves to its next
 * step: a status document when the server answered one, nothing otherwise (a server without
 * the query, or none reachable). Rejects only when `signal` aborts.
 */
async function askStatus(entry, request, canResend) {
  const { doFetch, url, method, template, sendOptions, keyValue, signal, now } = request;
  const headers = new Headers(template.headers);
  for (const name of [...headers.keys()]) if (BODY_FIELD.test(name)) headers.delete(name);
  headers.set(Names.key, keyValue(entry.key));
  headers.set(Names.status, run(ClientOp.StatusField, method)[0]);
  let document;
  try {
    const response = await doFetch(url, { ...sendOptions, method: "GET", headers, body: undefined, signal });
    if (response.status === 200 && mediaType(response) === Names.statusMediaType) {
      document = await response.text();
    } else {
      cancel(response);
    }
  } catch (err) {
    if (signal?.aborted) throw err;
  }
  if (signal?.aborted) throw abortReason(signal);
  return entry.onStatus(now(), document, canResend);
}

/** The last unix-time key's timestamp of each client id in this process. */
const lastTime = new Map();

function newKey(version, now) {
  // Random values are drawn here, inside the call, never at module load.
  if (version === 7) return run(ClientOp.KeyV7, now, crypto.getRandomValues(new Uint8Array(10)))[0];
  return run(ClientOp.KeyV4, crypto.getRandomValues(new Uint8Array(16)))[0];
}

/** Runs `change(sequence)` on the counter numbering of `options.counter`, in the epoch of
 * `key` when given (counter.js's `withSequence`, which comes with the full module). */
async function withSequence(options, change, key) {
  return (await fullApi()).withSequence(options.counter, options.persist, change, key);
}

/** What a call resolves to once `entry` is over with `outcome`: the persisted entry deleted
 * (kept while the outcome is undetermined: deleted, its id would send again under a new
 * key), a counter number given back once its answer is known. */
async function finishWith(entry, options, counterKey, outcome, fields) {
  if (options.persist && outcome !== FetchOutcome.Undetermined) await options.persist.delete(options.id);
  // Its answer arrived (or nothing can have run): the number no longer holds the low-water
  // mark back. An undetermined one keeps it until reconciled.
  if (counterKey !== null && outcome !== FetchOutcome.Undetermined) {
    await withSequence(options, (sequence) => sequence.done(counterKey), counterKey);
  }
  return { outcome: Names.outcomes[outcome], key: entry.key, attempts: entry.attempts, ...fields };
}

/**
 * `fetch` with an Idempotency-Key, retried until the interaction is complete.
 *
 * The key is generated once (a UUID v4, or v7 with `keyVersion: 7`) and sent with every
 * retry; retries follow the core's client state machine: exponential backoff with full
 * jitter, never sooner than `Retry-After`, within `retry.deadline` and `retry.maxAttempts`.
 * A changed payload for the same logical request is refused (IDEM-CLIENT-1). With
 * `persist` and `id`, the entry is saved before every send, so a restart resumes with the
 * same key. Every attempt is sent with all of `init`'s options (and an input Request's);
 * when `init.signal` (or the input Request's signal) aborts, nothing more is sent and the
 * call rejects at once with the signal's reason, the persisted entry kept (IDEM-JS-8).
 *
 * When an attempt ends without an answer (the retry budget or deadline spent after a send
 * that may have run, or an entry resumed after a restart), it asks the server what became of
 * the key (IDEM-CLIENT-8; `reconcile: false` turns this off): a completed key's replay is
 * fetched with the same key, a key in progress is asked about again, and a key the server
 * never saw is settled so that it never runs.
 *
 * Resolves to `{ outcome, key, attempts, response?, status?, reason? }` where `outcome` is
 * `completed` (2xx/3xx), `rejected` (a deterministic 4xx), `failed` (given up, and nothing
 * can have been processed), `executed` (the server says it ran; its response is gone, its
 * `status` when known), `not-executed` (settled: it never ran and never will; send again
 * under a new key) or `undetermined` (some attempt may have been processed and the server
 * could not say; with `persist`, the entry is kept: the same `id` asks again, or with
 * `reconcile: false` reports it undetermined until `reconcile` has asked).
 *
 * The key is this call's to send: a request that has an `Idempotency-Key` header of its own
 * is refused (IDEM-JS-1; give the key as `options.key`). A key is sent as an sf-string with
 * its quotes and backslashes escaped, unless `keyFormat` is `"bare"`. Unix-time keys of one
 * client in one process are each a millisecond of their own.
 */
export async function idempotentFetch(input, init = {}, options = {}) {
  const request = prepare(input, init, options);
  const { signal, template, method, url } = request;
  // A key of the caller's own would be replaced by this call's: each call would send another.
  if (template.headers.has(Names.key)) {
    throw rangeError("IDEM-JS-1", `a request's own ${Names.key} header is refused: give the key as options.key`);
  }
  // The body as a Blob, which every attempt sends again (and fetch, following a 307 or 308,
  // too: Node's cannot with bytes).
  const body = template.body === null ? null : await template.blob();
  const digest = await payloadDigest(method, url, new Uint8Array((await body?.arrayBuffer()) ?? 0));
  return joinOrLead(options, signal, digest, (enter) => sendEntry(request, options, body, digest, enter));
}

/** The send loop of `idempotentFetch` for the call that runs its entry (client-join.js):
 * the entry loaded or created, handed to `enter`, then sent, reported and persisted until it
 * is over. */
async function sendEntry(request, options, body, digest, enter) {
  const { doFetch, now, signal, template, sendOptions, method, url, kind, keyValue } = request;
  // The retry options are checked by the module.
  const retry = retryArgs(options.retry);
  const reconcile = options.reconcile ?? true;
  let entry = null;
  if (options.persist) {
    const saved = await options.persist.load(options.id);
    if (saved != null) entry = Outbox.fromBytes(saved, retry);
  }
  if (entry === null) {
    let key = options.key;
    if (key === undefined && kind === "unix-time") {
      // The timestamp is taken once: every retry sends the same key. Two requests of one
      // client in the same millisecond take the next one: each key is its request's own.
      const client = options.clientId ?? "";
      const at = Math.max(now(), (lastTime.get(client) ?? -1) + 1);
      lastTime.set(client, at);
      key = options.clientId === undefined ? String(at) : `${client}:${at}`;
    } else if (key === undefined && kind === "counter") {
      // A number no other request of this client has, saved before anything is sent.
      key = await withSequence(options, (sequence) => sequence.takeKey());
    }
    entry = Outbox.create(key ?? newKey(options.keyVersion ?? 4, now()), digest, retry);
  }
  enter(entry);
  const counterKey = kind === "counter" ? entry.key : null;
  const save = async () => {
    if (options.persist) await options.persist.save(options.id, entry.bytes);
  };
  const finish = (outcome, fields) => finishWith(entry, options, counterKey, outcome, { status: entry.lastStatus, ...fields });

  let next = null;
  // Whether the server was asked in this call: an undetermined step after that ends it.
  let asked = false;
  const resumable = entry.state === OutboxState.Sent || entry.state === OutboxState.Undetermined || entry.state === OutboxState.Asking;
  // Another payload under this id is refused before anything goes out (IDEM-CLIENT-1), also
  // when the entry is over: its outcome is not this payload's.
  entry.checkPayload(digest);
  if (resumable && reconcile) {
    // Saved in flight or unreconciled: the process stopped, and the effect is unknown.
    next = await askStatus(entry, request, true);
    asked = true;
    await save();
  } else if (entry.state === OutboxState.Sent) {
    next = entry.onNetworkError(now(), true);
    await save();
  } else if (resumable) {
    // Unreconciled, or waiting to ask again, and not to be asked about in this call: still
    // unknown, and kept for `reconcile`.
    return await finish(FetchOutcome.Undetermined, {});
  } else if (entry.outcome !== undefined) {
    // Saved when it was over (the process stopped before deleting it): report what it was,
    // a deterministic refusal included.
    return await finish(entry.outcome, {});
  }
  for (;;) {
    if (next !== null) {
      const step = next.kind;
      if (step === NextKind.Undetermined && reconcile && !asked) {
        next = await askStatus(entry, request, true);
        asked = true;
        await save();
        continue;
      }
      if (step === NextKind.AskStatus) {
        next = null;
        for (let due = entry.nextAsk(now()); due !== undefined && due > now() && !signal?.aborted; ) {
          await sleep(due - now() + 1, signal);
        }
        if (signal?.aborted) throw abortReason(signal);
        next = await askStatus(entry, request, true);
        await save();
        continue;
      }
      if (step !== NextKind.Retry) {
        const outcome = next.outcome;
        const fields = { reason: next.reason, status: step === NextKind.Executed ? next.status : entry.lastStatus };
        return await finish(outcome, fields);
      }
      // A retry, the replay fetch after a status query included (if that ends undetermined
      // too, the call ends: the server is not asked twice in one call).
      next = null;
    }
    // Timers may fire a little early against the clock: wait until the backoff has ended.
    for (let due = entry.nextSend(now()); due !== undefined && due > now() && !signal?.aborted; ) {
      await sleep(due - now() + 1, signal);
    }
    if (signal?.aborted) throw abortReason(signal);
    entry.send(now(), digest);
    await save();
    const headers = new Headers(template.headers);
    headers.set(Names.key, keyValue(entry.key));
    if (counterKey !== null) {
      headers.set(Names.lowWater, await withSequence(options, (sequence) => sequence.lowWater(), counterKey));
    }
    let response;
    try {
      response = await doFetch(url, { ...sendOptions, method, headers, body, signal });
    } catch (err) {
      // Aborted while in flight: the entry stays as sent (its effect unknown) for a resume.
      if (signal?.aborted) throw err;
      next = entry.onNetworkError(now(), networkErrorWasLost(err));
      await save();
      continue;
    }
    const problem = await problemType(response);
    // Aborted while the answer was read: it is not reported, and the entry stays as sent.
    if (signal?.aborted) throw abortReason(signal);
    next = entry.onResponse(now(), response.status, retryAfterSeconds(response.headers.get("retry-after"), now()), problem, response.headers.get(Names.replayed) === "true");
    await save();
    if (next.kind === NextKind.Complete) {
      const outcome = next.outcome;
      // The answer is the caller's once its body has arrived: one that breaks off is an
      // answer lost, and the same key fetches its replay (IDEM-CLIENT-2).
      try {
        await response.clone().arrayBuffer();
      } catch {
        next = entry.onNetworkError(now(), true);
        await save();
        if (signal?.aborted) throw abortReason(signal);
        continue;
      }
      entry.markProcessed();
      return await finish(outcome, { status: response.status, response });
    }
    // A response that does not end the interaction is not returned.
    cancel(response);
  }
}

/**
 * Asks what became of the request persisted under `options.id` without sending it again
 * (its payload is gone: the page that made it was closed, the process crashed), with a
 * settling status query (IDEM-CLIENT-8). `input` and `init` are the original request's URL,
 * method and headers (its credentials); a body is ignored.
 *
 * Resolves to `{ outcome, key, attempts, status?, reason? }`: `executed` (it ran; `status`
 * is its stored status when the server still has it), `not-executed` (settled: it never ran
 * and never will), or `undetermined` (the server could not say, or could not be reached: the
 * entry is kept, ask again later); an entry that was already over reports its outcome, and
 * `null` when nothing is persisted under `id`.
 */
export async function reconcile(input, init = {}, options = {}) {
  if (!options.persist || typeof options.id !== "string") {
    throw rangeError("IDEM-JS-1", "reconcile needs options.persist and options.id");
  }
  const request = prepare(input, init, options);
  return joinOrLead(options, request.signal, undefined, () => reconcileEntry(request, options));
}

/** `reconcile` once no other call of this process runs the entry (client-join.js). */
async function reconcileEntry(request, options) {
  const saved = await options.persist.load(options.id);
  if (saved == null) return null;
  const entry = Outbox.fromBytes(saved, retryArgs(options.retry));
  const counterKey = request.kind === "counter" ? entry.key : null;
  if (entry.outcome !== undefined && entry.state !== OutboxState.Undetermined) {
    return await finishWith(entry, options, counterKey, entry.outcome, { status: entry.lastStatus });
  }
  if (entry.state === OutboxState.Created) {
    // Never sent: nothing can have run.
    await options.persist.delete(options.id);
    return { outcome: Names.outcomes[FetchOutcome.NotExecuted], key: entry.key, attempts: 0 };
  }
  for (;;) {
    const due = entry.nextAsk(request.now());
    for (let at = due; at !== undefined && at > request.now() && !request.signal?.aborted; ) {
      await sleep(at - request.now() + 1, request.signal);
    }
    const next = await askStatus(entry, request, false);
    await options.persist.save(options.id, entry.bytes);
    const step = next.kind;
    const fields = { reason: next.reason, status: next.status ?? undefined };
    const outcome = next.outcome;
    if (step === NextKind.AskStatus) continue;
    return await finishWith(entry, options, counterKey, outcome, fields);
  }
}
