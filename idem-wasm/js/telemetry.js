// Telemetry: the spans and metrics of every operation the drive loop serves, under idem-core's
// names (`telemetryNames()`: the same names as the Rust tower layer's), handed to a hook that
// records them (`idem/opentelemetry` builds one from `@opentelemetry/api`). Without
// `options.telemetry` nothing here runs and the digest is never computed.
//
// The rules are the core's: which event decides (`decisionMask`), the outcome
// (`operationOutcome`), the error type (`Engine.errorType`), the record's digest
// (`Engine.keyDigest`). This file only moves them to the hook.
import { decisionMask, eventNames, operationOutcome, telemetryNames } from "./idem_wasm.js";
import { rangeError } from "./util.js";

let names = null;
let decisions = 0;
let events = null;

/** Checks a hook: `{ startSpan(name, attributes), count(metric, n, attributes),
 * record(metric, value, attributes, unit), inSpan?(span, fn) }` (IDEM-JS-1). */
export function checkTelemetry(hook) {
  const ok = hook !== null && typeof hook === "object" && ["startSpan", "count", "record"].every((f) => typeof hook[f] === "function");
  if (!ok || (hook.inSpan !== undefined && typeof hook.inSpan !== "function")) {
    throw rangeError("IDEM-JS-1", "options.telemetry must be a telemetry hook: { startSpan, count, record } (see idem/opentelemetry)");
  }
}

/** The telemetry of one engine: opens an operation's trace. */
export class Telemetry {
  #hook;
  constructor(hook) {
    checkTelemetry(hook);
    this.#hook = hook;
    if (names === null) {
      names = JSON.parse(telemetryNames());
      decisions = decisionMask();
      events = eventNames().split(",");
    }
  }

  /** The trace of the operation in `slot`: its span opened, with the method and route of
   * the HTTP request it serves (`http`, or undefined). */
  begin(engine, slot, http) {
    return new Trace(this.#hook, engine, slot, http);
  }
}

class Trace {
  #hook;
  #span;
  #operation;
  #decision = -1;

  constructor(hook, engine, slot, http) {
    const a = names.attributes;
    const operation = engine.operationIndex(slot);
    this.#hook = hook;
    this.#operation = names.operations[operation];
    const attributes = { [a.operation]: this.#operation };
    const digest = engine.keyDigest(slot);
    if (digest !== undefined) attributes[a.keyDigest] = digest;
    if (http !== undefined) {
      attributes[a.httpRequestMethod] = http.method;
      if (http.route !== undefined) attributes[a.httpRoute] = http.route;
    }
    this.#span = hook.startSpan(names.spans[operation], attributes);
  }

  /** Runs the handler in the span's context, where the hook can (so that its own spans
   * are children of this one). */
  run(fn) {
    if (this.#hook.inSpan === undefined) return fn();
    // A hook that fails before it runs the handler never changes how the request is
    // answered: the handler runs outside the span.
    let ran = false;
    try {
      return this.#hook.inSpan(this.#span, () => {
        ran = true;
        return fn();
      });
    } catch (err) {
      if (ran) throw err;
      return fn();
    }
  }

  /** An event of the operation (its index in `eventNames()`): the first that decides is the
   * decision; a takeover is counted. */
  event(index) {
    try {
      if (this.#decision < 0 && (decisions & (1 << index)) !== 0) {
        this.#decision = index;
        this.#span.setAttribute(names.attributes.decision, events[index]);
      }
      if (index === names.takeover) this.#hook.count(names.metrics.leaseTakeovers, 1, {});
    } catch {
      // A failing hook never changes how a request is answered.
    }
  }

  /** A store call (`load`, `apply` or `claim`) that took `seconds`; `written`: an applied
   * write. */
  store(operation, seconds, written) {
    try {
      const attributes = { [names.attributes.storeOperation]: names.storeOperations[operation] };
      this.#hook.record(names.metrics.storeDuration, seconds, attributes, names.storeDurationUnit);
      if (written) this.#hook.count(names.metrics.recordsWritten, 1, {});
    } catch {
      // A failing hook never changes how a request is answered.
    }
  }

  /** Ends the span with the answer's `status` (undefined: the handler threw), and counts
   * the operation by outcome. The caller catches what the hook throws. */
  end(engine, slot, status) {
    const a = names.attributes;
    const span = this.#span;
    const outcome = names.outcomes[operationOutcome(this.#decision, status ?? 0)];
    const error = status === undefined ? names.errorTypeOther : engine.errorType(slot, status);
    if (status !== undefined) span.setAttribute(a.httpResponseStatusCode, status);
    if (error !== undefined) span.setAttribute(a.errorType, error);
    span.setAttribute(a.outcome, outcome);
    span.end();
    this.#hook.count(names.metrics.requests, 1, { [a.outcome]: outcome, [a.operation]: this.#operation });
  }
}

/** Seconds since `start` (a `performance.now()` reading). */
export function secondsSince(start) {
  return (performance.now() - start) / 1000;
}
