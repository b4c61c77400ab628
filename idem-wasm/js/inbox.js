// The inbox: `Inbox`, a receiver's inbox for webhooks and at-least-once queues, and what a
// delivery came to (the core's delivery outcome and its receipt). Each delivery is an
// operation that `Idempotency#deliver` opens and the drive loop serves.
import { acknowledgedMask, deliveryNames } from "./idem_wasm.js";
// A cycle (server.js imports `delivered` from here): neither module uses the other's names
// before a call.
import { Idempotency } from "./server.js";
import { givenBytes, rangeError, toResponse, wellFormed } from "./util.js";

const INBOX_OPTIONS = ["store", "responseTtl", "keyTtl", "lease", "unknownOutcome", "fingerprint", "onEvent", "telemetry", "now"];

let deliveries = null;
/** A delivery outcome's name and whether its sender is told it was received (the core's). */
function deliveryOf(index) {
  deliveries ??= { names: deliveryNames().split(","), acknowledged: acknowledgedMask() };
  return { outcome: deliveries.names[index], acknowledge: (deliveries.acknowledged & (1 << index)) !== 0 };
}

/**
 * A receiver's inbox (webhooks, at-least-once queues): the first delivery of a message is
 * processed, redeliveries are acknowledged without processing. A message is named by its
 * source (the sender) and the id the source gives it. Each delivery is an operation of the
 * engine's request machine, as in every host: its record (under `<source>#inbox` and the
 * id) is claimed before processing and stored as processed after, and what became of it is
 * the engine's, never read back from a reply.
 */
export class Inbox {
  #idem;

  constructor(options) {
    if (options === null || typeof options !== "object") throw rangeError("IDEM-JS-1", "options must be an object with a store");
    for (const name of Object.keys(options)) {
      if (!INBOX_OPTIONS.includes(name)) throw rangeError("IDEM-JS-1", `unknown option "${name}"`);
    }
    // The key retention is how long a message id is remembered: it must outlast the
    // source's redelivery horizon.
    this.#idem = new Idempotency({ ...options, principal: "none" });
  }

  /**
   * Receives one delivery `{ source, id, body?, contentType? }` (body: the payload as text or
   * bytes, an ArrayBuffer or a view of one, so that the same id with another payload is a
   * conflict; a JSON payload is compared canonically) and runs `process(context)` for the
   * first one (`context`: `{ source, id, recovered, fence, leaseExpires, extend() }`; a
   * processing that may outlast the lease calls `extend()`, as a handler does). Resolves to
   * `{ outcome, acknowledge, retryAfter?, response }`: `processed` (it ran now),
   * `duplicate` (already processed, also after its stored answer expired while its id is
   * remembered: acknowledge and do nothing, IDEM-INBOX-1), `in-progress` (another delivery
   * is being processed: do not acknowledge, so that the source sends it again,
   * IDEM-INBOX-2), `conflict` (the id of a processed message came with another payload:
   * acknowledged, not processed; log it, IDEM-INBOX-3), `held` (an earlier delivery's
   * outcome is unknown and held), `failed` (processed, its outcome not recorded), `refused`
   * (a malformed id, the store failed, or another payload under the id of a message not
   * processed yet, which is not acknowledged: IDEM-INBOX-3); `response` is the engine's
   * receipt to answer the sender with. If `process` throws, the error is rethrown (answer
   * the source with an error: it redelivers, and the next delivery runs as `recovered`).
   */
  async receive({ source, id, body, contentType }, process) {
    if (typeof source !== "string" || source === "" || typeof id !== "string") {
      throw rangeError("IDEM-JS-1", "receive needs { source, id }: the sender and its message id");
    }
    // A lone surrogate would be U+FFFD in the module: two senders would be one, and one's
    // message acknowledged as the other's duplicate without being processed.
    if (!wellFormed(source)) throw rangeError("IDEM-JS-1", "the source must be well-formed text (no lone surrogate)");
    if (contentType !== undefined && typeof contentType !== "string") throw rangeError("IDEM-JS-1", "contentType must be a string");
    // Checked before the message is claimed: a claim whose processing never starts would be
    // taken for a crashed one by the next delivery.
    if (typeof process !== "function") throw rangeError("IDEM-JS-1", "receive needs process(context), the function that processes the message");
    return this.#idem.deliver({ source, id, contentType, body: givenBytes(body, "a delivery's body") }, process);
  }
}

/** What became of the delivery in `slot`, with its receipt `reply`. */
export function delivered(engine, slot, reply) {
  const { outcome, acknowledge } = deliveryOf(engine.delivery(slot));
  const result = { outcome, acknowledge, response: toResponse(reply) };
  const retryAfter = headerOf(reply, "retry-after");
  if (retryAfter !== undefined) result.retryAfter = Number(retryAfter);
  return result;
}

function headerOf(reply, name) {
  for (let i = 0; i < reply.headers.length; i += 2) if (reply.headers[i] === name) return reply.headers[i + 1];
  return undefined;
}
