// The example's order handler and its problem responses: the worker's `POST /orders` runs it
// in the orders object, with idempotency and without, and the benchmark's floors
// (bench/inside-worker.js) run it on their own.
import { idempotencyOf } from "../../../dist/workerd.js";

const EXAMPLE_PROBLEM = "urn:idem-example:problem:";

/** An `application/problem+json` response (RFC 9457) for refusals of the example itself,
 * under a type prefix of its own; idem renders its own problems with the core's types. */
export function problem(status, slug, title, detail, headers = {}) {
  return new Response(JSON.stringify({ type: EXAMPLE_PROBLEM + slug, title, status, detail }), {
    status,
    headers: { "content-type": "application/problem+json", ...headers },
  });
}

/** A promise that never settles. */
const hang = () => new Promise(() => {});

/**
 * The order handler: validates the order, counts the run (`run()`, the side-effect oracle),
 * and answers 201 with the order. The body's optional `outcome` simulates what real payment
 * back ends do: "decline" answers a deterministic 402 (stored and replayed), "unavailable" a
 * 503 (an unknown outcome: not stored, the retry runs again), "error" makes the first attempt
 * throw (an unknown outcome too: the retry takes over at once, told it recovers), and "crash"
 * makes the first attempt die without an answer (with claims written, ORDER_WRITES_ONLY =
 * "off", the key stays in flight until its lease ends and the retry that takes over is told
 * it recovers, and succeeds; with claims held in memory, nothing of the attempt remains and
 * the retry runs as a first attempt, at once). ORDER_DELAY_MS
 * simulates slow work. With `store` (a DurableObjectLocalStore), the order itself is written
 * with the stored response, in one atomic write, or never; with `storage` (the object's, and
 * no idempotency), it is written at once. `crash` is how the handler dies.
 */
export async function createOrder(request, delayMs, run, { store, storage, crash = hang } = {}) {
  const type = request.headers.get("content-type") ?? "";
  if (!/^application\/json\s*(;|$)/i.test(type)) {
    return problem(415, "unsupported-media-type", "Orders are JSON", "send Content-Type: application/json");
  }
  let order;
  try {
    order = JSON.parse(await request.text());
  } catch {
    return problem(400, "invalid-order", "The order is not valid JSON", "the body must be a JSON object");
  }
  if (order === null || typeof order !== "object" || Array.isArray(order)) {
    return problem(400, "invalid-order", "The order is not a JSON object", "the body must be a JSON object");
  }
  const context = idempotencyOf(request);
  const recovered = context?.recovered ?? false;
  const n = await run();
  if (delayMs > 0) await new Promise((resolve) => setTimeout(resolve, delayMs));
  // The context builds the answer from its bytes, so withIdempotency stores it without
  // reading it back: the run count written above then goes to storage in the same write as
  // the completion, instead of one write of its own.
  const json = (status, body, headers) => (context ?? Response).json(body, { status, headers });
  switch (order.outcome) {
    case "error":
      if (!recovered) throw new Error("the payment provider failed mid-request");
      break;
    case "crash":
      // In the worker: a promise that never settles and no pending I/O, so workerd cancels
      // the request and answers 500 itself. In the orders object: the object aborts. Either
      // way withIdempotency never records an outcome. That is a real crash from the key's
      // point of view: only the lease ends it.
      if (!recovered) await crash();
      break;
    default:
      break;
  }
  const id = `ord_${String(n).padStart(6, "0")}`;
  const answer = () => {
    if (order.outcome === "decline") return json(402, { error: "card_declined", execution: n });
    if (order.outcome === "unavailable") return json(503, { error: "unavailable", execution: n });
    return json(201, { id, execution: n, recovered }, { location: `/orders/${id}` });
  };
  // The order (declined ones too) is written with the answer: a stored answer commits it, a
  // 503 (not stored) does not. Nothing but this object's storage is awaited from here to the
  // completion, so no other request of the object runs in between: the read of the order
  // count and the write of the new one cannot interleave with another's.
  const write = async (tx) => {
    tx.put("orders", ((await tx.get("orders")) ?? 0) + 1);
    tx.put(`order:${id}`, { id, execution: n, outcome: order.outcome ?? "created" });
    return answer();
  };
  if (store !== undefined && context !== undefined) return store.transaction(context, write);
  // Without idempotency: both puts, with nothing awaited between them, are one atomic write
  // of the object.
  if (storage !== undefined) return write(storage);
  return answer();
}
