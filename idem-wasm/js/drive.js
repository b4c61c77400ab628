// The drive loop: the one loop that drives every operation of the engine (a guarded request,
// a token, a session, an inbox delivery) from its slot to its answer, and the context a
// handler runs with.
//
// Every rule is idem-core's request machine (compiled to WebAssembly): this file only moves
// data. It asks the machine for the next step and does it (read or write the store, sleep,
// run the handler, send the reply), reporting each result back. With the MemoryStore every
// store step runs inside the module.
//
// One file for the loop and the run context: a handler's heartbeats and its completion go
// through the same pump as the loop's own store steps, one at a time, so both share the
// request's state here. The responses a context builds are in answers.js.
import { HeartbeatState, Ran, StepKind as Step, StoreFailed, eventNames, securityMask, storeTimeoutMs } from "./idem_wasm.js";
import { bounded } from "./errors.js";
import { stalledReply } from "./edge.js";
import { random32, sleep } from "./common.js";
import { secondsSince } from "./telemetry.js";
import { json, respond } from "./answers.js";
import { CLAIM_IN_SLOT, attemptText, listText, rangeError, takeContext, takeReply, takeWrite } from "./util.js";

const EMPTY = new Uint8Array(0);
let events = null;
function eventName(index) {
  events ??= { names: eventNames().split(","), security: securityMask() };
  return events.names[index];
}
function securityRelevant(index) {
  eventName(0);
  return (events.security & (1 << index)) !== 0;
}

/**
 * Drives slots of one engine on one store: `serve` polls a slot's machine and performs each
 * step until it answers or runs the handler. `Idempotency` opens the slots (a request, a
 * token, a session, a delivery) and serves them here.
 */
export class Driver {
  #engine;
  #optionsText;
  #store;
  #records;
  #onEvent;
  #now;
  #telemetry;
  /** Whether events are read: for `onEvent` or the telemetry. */
  #observed;
  /** The largest response body the store keeps. */
  #maxResponseBytes;
  /** The method and route of the requests whose slots are open, for their spans (only with
   * telemetry). */
  #http = new Map();

  /** `records` is the MemoryStore's records inside the module (or null for other stores);
   * `optionsText` the engine options, for a store that claims itself (a Durable Object);
   * `telemetry` a `Telemetry` (telemetry.js) or null. */
  constructor(engine, store, records, optionsText, now, onEvent, telemetry) {
    this.#engine = engine;
    this.#optionsText = optionsText;
    this.#store = store;
    this.#records = records;
    this.#onEvent = onEvent;
    this.#now = now;
    this.#telemetry = telemetry;
    this.#observed = onEvent !== null || telemetry !== null;
    this.#maxResponseBytes = engine.maxResponseBytes;
  }

  /** With telemetry: the method and route of the request in `slot`, for its span. */
  describe(slot, method, route) {
    if (this.#telemetry !== null) this.#http.set(slot, { method, route });
  }

  #emit(request, extra) {
    const engine = this.#engine;
    const slot = request.slot;
    for (let i = engine.event(slot); i >= 0; i = engine.event(slot)) {
      if (request.trace !== null) request.trace.event(i);
      if (this.#onEvent === null) continue;
      const name = eventName(i);
      let key = null;
      try {
        key = engine.key(slot) || null;
      } catch {}
      const event = { name, key, securityRelevant: securityRelevant(i), ...extra };
      if (name === "rejected") {
        const code = engine.refusalCode(slot);
        if (code !== undefined) event.code = code;
      }
      try {
        this.#onEvent(event);
      } catch {
        // A failing hook never changes how a request is answered.
      }
    }
  }

  /** Drives the slot's request and answers: `execute(context)` when this request runs, or
   * `answer(reply)` with the engine's reply (replay, 409, 422, 410, 413, 503, …). Ends the
   * slot. */
  async serve(slot, answer, execute) {
    const engine = this.#engine;
    const request = new Served(slot);
    if (this.#telemetry !== null) {
      try {
        request.trace = this.#telemetry.begin(engine, slot, this.#http.get(slot));
      } catch {
        // A failing hook never changes how a request is answered.
      }
      this.#http.delete(slot);
    }
    try {
      for (;;) {
        // The memory store answers at once: no await on the common path.
        const step = this.#records !== null ? this.#driveIn(request) : await this.#advance(request);
        if (step === Step.WaitUntil) {
          await sleep(Math.max(0, engine.waitUntil(slot) - this.#now()));
          continue;
        }
        if (step === Step.Reply) {
          const reply = takeReply(engine, slot);
          request.status = reply.status;
          return answer(reply);
        }
        if (step !== Step.Run) throw new Error(`idem: unexpected step ${Step[step]}`);
        const context = new RunContext(
          engine,
          request,
          (ran, status, headers, body) => this.#finish(request, ran, status, headers, body),
          (context) => this.#extend(request, context),
          this.#now,
        );
        return await (request.trace === null ? execute(context) : request.trace.run(() => execute(context)));
      }
    } finally {
      request.ended = true;
      if (request.trace !== null) {
        try {
          request.trace.end(engine, slot, request.status);
        } catch {
          // A failing hook never changes how a request is answered.
        }
      }
      // A store that keeps something for an attempt (a handler's transaction) lets go of it
      // when the attempt's request is over, however it ended (IDEM-STORE-7).
      const store = this.#store;
      const key = request.high >= 0 && !request.storeEnded && typeof store.end === "function" ? request.storageKey(engine) : null;
      const close = () => {
        engine.end(slot);
        if (key !== null) {
          try {
            Promise.resolve(store.end(key, request.attempt)).catch(() => {});
          } catch {
            // A store's failure to let go is its own; the answer stands.
          }
        }
      };
      // A heartbeat or completion still on its way ends the slot when it is done.
      if (request.busy === null) close();
      else request.busy.finally(close);
    }
  }

  /** Polls and performs the store steps until the machine asks for something else: run,
   * wait, reply, done, or an input (idle). One pump per request at a time, so that a
   * heartbeat and a completion are written one after the other, as the machine orders them. */
  async #advance(request) {
    if (this.#records !== null) return this.#driveIn(request);
    while (request.busy !== null) await request.busy;
    const run = this.#pump(request);
    request.busy = run.then(
      () => {},
      () => {},
    );
    try {
      return await run;
    } finally {
      request.busy = null;
    }
  }

  async #pump(request) {
    const slot = request.slot;
    const engine = this.#engine;
    const store = this.#store;
    const trace = request.trace;
    // A store in this isolate claims on the slot itself and hands back the step after.
    const here = store[CLAIM_IN_SLOT] === undefined ? null : store;
    let next = null;
    for (;;) {
      const step = next ?? engine.poll(slot, this.#now());
      next = null;
      if (this.#observed) this.#emit(request);
      if (step !== Step.Claim && step !== Step.Load && step !== Step.Apply) return step;
      const start = trace === null ? 0 : performance.now();
      try {
        if (step === Step.Apply) {
          const write = takeWrite(engine, slot);
          // The completion says so, and whose it is: a store that commits it in the
          // handler's own transaction (PostgresStore#transaction) tells it from a heartbeat,
          // and one attempt's transaction from another's.
          const info = request.outcome === undefined ? undefined : { outcome: request.outcome, fence: engine.fence(slot), attempt: request.attempt };
          const applied = await store.apply(request.storageKey(engine), write, this.#now(), info);
          if (trace !== null) trace.store("apply", secondsSince(start), applied === true);
          engine.applied(slot, this.#now(), applied === true);
        } else if (step === Step.Claim && here !== null) {
          const after = here[CLAIM_IN_SLOT](engine, slot, request.storageKey(engine), this.#now(), step);
          next = typeof after === "number" ? after : await after;
          if (trace !== null) trace.store("claim", secondsSince(start), false);
        } else if (step === Step.Claim && typeof store.claim === "function") {
          // The engine knows the nonce the object claims with: a record it creates is withdrawn
          // if its answer is lost (IDEM-STORE-12).
          const hi = random32();
          const lo = random32();
          const bytes = await store.claim(request.storageKey(engine), engine.ticket(slot, hi, lo), this.#optionsText, this.#now(), hi, lo);
          if (trace !== null) trace.store("claim", secondsSince(start), false);
          engine.claimed(slot, this.#now(), bytes);
        } else {
          const current = await store.load(request.storageKey(engine));
          if (trace !== null) trace.store("load", secondsSince(start), false);
          engine.record(slot, this.#now(), current?.value ?? undefined);
        }
      } catch (err) {
        if (err?.code === "IDEM-REC-1" || err?.code === "IDEM-JS-2") throw err;
        engine.storeFailed(slot, storeFailed(err));
        if (this.#observed) this.#emit(request, { error: err });
      }
    }
  }

  /** Records the handler's outcome (IDEM-OUT-5: before the response leaves). With the
   * memory store it is done at once; otherwise it returns a promise. Its result is null
   * when the handler's answer goes out, or the engine's reply to send instead when another
   * attempt took the lease over (IDEM-LEASE-5: the key's outcome, never this attempt's). */
  #finish(request, ran, status, headers, body) {
    const engine = this.#engine;
    // A body longer than the store keeps is recorded as such without copying it into the
    // module, whose memory would keep the size it grew to (IDEM-STORE-5).
    if (ran === Ran.Answered && body.byteLength > this.#maxResponseBytes) {
      ran = Ran.Oversized;
      body = EMPTY;
    }
    request.outcome = ran === Ran.Threw ? "threw" : "answered";
    if (ran !== Ran.Threw) request.status = status;
    let refused = null;
    try {
      engine.outcome(request.slot, ran, status, headers === null ? "" : listText(headers), body);
    } catch (err) {
      if (ran === Ran.Threw) throw err;
      // An answer the engine cannot record (a status outside 100–599, IDEM-OUT-1) is no
      // answer: recorded as a failure, so that the key is not held for nobody, and the error
      // goes on to the caller.
      refused = err;
      request.outcome = "threw";
      request.status = undefined;
      engine.outcome(request.slot, Ran.Threw, 0, "", EMPTY);
    }
    // An answer longer than the store keeps goes on after its outcome is in (IDEM-STORE-5).
    request.passing = refused === null && ran === Ran.Oversized;
    if (this.#records !== null) {
      const instead = this.#instead(request, this.#driveIn(request));
      if (refused !== null) throw refused;
      return instead;
    }
    const done = this.#advance(request).then((step) => this.#ended(request, step));
    return refused === null ? done : done.then(() => Promise.reject(refused));
  }

  /** After the outcome, on a store that keeps something for an attempt: the attempt is over,
   * so the store lets go of it now; if that was the handler's own writes, uncommitted (a
   * completion that lost its race, then could not read the record again), the handler's
   * response may describe them and does not go out (IDEM-STORE-7). Then `#instead`. */
  async #ended(request, step) {
    const store = this.#store;
    if (step === Step.Done && typeof store.end === "function") {
      // From here the request is over for the handler's context: a transaction asked for
      // now (by a task the handler left behind) is refused, as after the request.
      const key = request.storageKey(this.#engine);
      request.storeEnded = true;
      let dropped = false;
      try {
        // A store that answers at once (DurableObjectLocalStore) costs no timer; one that
        // answers later is waited for no longer than a store call may take: a store that does
        // not answer has not said that it dropped anything.
        const ended = store.end(key, request.attempt);
        dropped = (ended instanceof Promise ? await bounded(ended, storeTimeoutMs(), "the store's end") : ended) === true;
      } catch {
        // A store's failure to let go is its own.
      }
      if (dropped) this.#engine.writesDropped(request.slot);
    }
    return this.#instead(request, step);
  }

  /** After the outcome: the reply that replaces the handler's answer, or null. */
  #instead(request, step) {
    if (step !== Step.Done) return null;
    const reply = takeReply(this.#engine, request.slot);
    if (reply !== null) request.status = reply.status;
    return reply;
  }

  /** Every store step in the memory store, at once. */
  #driveIn(request) {
    const step = this.#engine.driveIn(this.#records, request.slot, this.#now());
    if (this.#observed) this.#emit(request);
    return step;
  }

  async #extend(request, context) {
    const engine = this.#engine;
    // A heartbeat of a handler still producing an answer whose outcome is in (too long to
    // keep, recorded as such): no lease is left to keep, and nothing depends on one.
    if (request.passing) return;
    if (request.ended) throw rangeError("IDEM-LEASE-3", "the request is over: its lease has ended");
    const refused = engine.heartbeat(request.slot, this.#now());
    if (refused === HeartbeatState.Quiet) await this.#advance(request);
    // (Or the outcome came in while this heartbeat was on its way.)
    if (request.passing) return;
    const state = refused === HeartbeatState.Quiet ? engine.heartbeatState(request.slot) : refused;
    if (state === HeartbeatState.Extended) {
      context.leaseExpires = engine.leaseExpires(request.slot);
      return;
    }
    if (state === HeartbeatState.FencedOut) throw rangeError("IDEM-LEASE-2", "the lease was taken over by another attempt");
    if (state === HeartbeatState.Expired) throw rangeError("IDEM-LEASE-3", "the lease had ended before the heartbeat");
    const err = new Error("the idempotency store failed; the lease may not have been extended");
    err.code = "IDEM-STORE-4";
    throw err;
  }
}

/** One request (a slot) being served: what its drive loop, its heartbeats and its completion
 * share. */
class Served {
  constructor(slot) {
    this.slot = slot;
    /** The store steps on their way, if any (one pump at a time). */
    this.busy = null;
    this.ended = false;
    /** "answered" or "threw", once the handler is done. */
    this.outcome = undefined;
    /** Whether its answer goes on past its recorded outcome (too long to keep). */
    this.passing = false;
    this.trace = null;
    this.status = undefined;
    /** The halves of the running attempt's identity (`high` is -1 until one runs): its text
     * is made only for a store or a handler that asks for it, once. */
    this.high = -1;
    this.low = 0;
    this.attemptText = undefined;
    /** The record's storage key, once asked for. */
    this.key = undefined;
    /** Whether the store was told that the attempt is over (`end`), at its completion. */
    this.storeEnded = false;
  }

  /** The running attempt's identity, or undefined when none ran. */
  get attempt() {
    if (this.high < 0) return undefined;
    this.attemptText ??= attemptText(this.high, this.low);
    return this.attemptText;
  }

  /** The record's storage key (the engine's, asked for once per request). */
  storageKey(engine) {
    this.key ??= engine.storageKey(this.slot);
    return this.key;
  }
}

/** What a handler runs with: its key, whether it recovers from an attempt whose lease
 * ended, the fence and end of its lease, and `extend()`. `finish` and `storageKey` are not
 * the handler's data: they sit on the prototype, so they are not enumerated (and a class
 * instance is made far faster than an object given properties one by one). */
class RunContext {
  #engine;
  #request;
  #finish;
  #now;
  constructor(engine, request, finish, extend, now) {
    // One call for the four, not one each.
    const { key, recovered, fence, leaseExpires, high, low } = takeContext(engine, request.slot);
    this.key = key;
    this.recovered = recovered;
    this.fence = fence;
    this.leaseExpires = leaseExpires;
    request.high = high;
    request.low = low;
    // Its own property, so that `const { extend } = context` works.
    this.extend = () => extend(this);
    this.#engine = engine;
    this.#request = request;
    this.#finish = finish;
    this.#now = now;
  }

  /** The milliseconds left of the lease, on the engine's clock, as the engine has it (a
   * heartbeat's write is counted once it is applied, before `extend()` returns): until when
   * an adapter reads the handler's answer (IDEM-OUT-7; `withinLease`). */
  leaseLeft() {
    return this.#request.ended ? 0 : this.#engine.leaseExpires(this.#request.slot) - this.#now();
  }

  /** The store steps of a heartbeat still on their way, or null: once they are done, the
   * lease may end later than `leaseLeft()` says now (`withinLease`). */
  leaseSettling() {
    return this.#request.busy;
  }

  /** Records the handler's outcome (what the adapters call once the handler is done). */
  finish(ran, status, headers, body) {
    return this.#finish(ran, status, headers, body);
  }

  /** Records that the handler failed with `err`, and rethrows it; except for an answer that
   * stalled past the lease (IDEM-OUT-7), whose caller is answered here: with the key's
   * outcome when another attempt took the lease over (IDEM-LEASE-5), otherwise with the
   * core's 500 problem. Resolves to that reply. */
  async threw(err) {
    const instead = await this.#finish(Ran.Threw, 0, null, EMPTY);
    if (err?.code !== "IDEM-OUT-7") throw err;
    return instead ?? stalledReply();
  }

  /** The record's storage key, for a handler that asks for it (PostgresStore#transaction). */
  get storageKey() {
    if (this.#request.ended || this.#request.storeEnded) throw rangeError("IDEM-LEASE-3", "the request is over");
    return this.#request.storageKey(this.#engine);
  }

  /** This attempt's identity (16 hex digits), unique across every attempt at every key: what
   * a store keys something it keeps for the attempt by (PostgresStore#transaction). */
  get attempt() {
    return this.#request.attempt;
  }

  /** `new Response(body, init)`, as `withIdempotency` stores and returns it (answers.js). */
  respond(body, init) {
    return respond(body, init);
  }

  /** `Response.json(value, init)`, stored as `respond` stores its body. */
  json(value, init) {
    return json(value, init);
  }
}

/** How a store call failed, by its error's code: full (IDEM-STORE-3), a sealed record
 * (IDEM-SEAL-3), a completion that may not have committed the handler's transaction
 * (IDEM-STORE-7), or unavailable. */
function storeFailed(err) {
  switch (err?.code) {
    case "IDEM-STORE-3":
      return StoreFailed.Full;
    case "IDEM-SEAL-3":
      return StoreFailed.Sealed;
    case "IDEM-STORE-7":
      return StoreFailed.Uncommitted;
    default:
      return StoreFailed.Unavailable;
  }
}
