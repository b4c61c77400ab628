// The workload that bench.mjs and fetch.mjs share, so that their rows measure the same work:
// the order body and the handler's reply, the Fetch handler every Fetch row runs, and the two
// Fetch floors (what any Fetch-standard idempotency wrapper must do, with no idempotency at
// all). fetch.mjs runs under Node, Bun and Deno: nothing here is Node's own.

/** The parsed request body, built for each request: about 90 bytes as JSON (`changed`: the
 * body a mismatch sends under the same key). */
export const bodyOf = (i, changed = false) => ({ amount: changed ? 2000 + i : 1000 + i, currency: "eur", customer: `cus_${i}`, note: "benchmark order" });

/** The order the HTTP benchmarks send on every request (bench/http.mjs, bench/http-cost.mjs):
 * a nested JSON body of about 200 bytes. */
export const nestedOrder = JSON.stringify({
  customer: { id: "cus_42", tier: "gold" },
  items: [
    { sku: "sku_17", qty: 2, price: 1250 },
    { sku: "sku_91", qty: 1, price: 399, options: { gift: true, note: null } },
  ],
  currency: "eur",
  total: 2899,
  metadata: { source: "web", attempt: 1, tags: ["checkout", "v2"] },
});

/** The handler's reply object. */
export const answer = (i) => ({ id: `ord_${i}`, status: "created" });

/** The handler every Fetch row runs: it parses the order and answers 201 with JSON. */
export async function orderHandler(request) {
  const order = await request.json();
  return Response.json(answer(order.amount - 1000), { status: 201 });
}

/** The Fetch floor with the handler: the copies a Fetch-standard idempotency wrapper has to
 * make around a handler that runs (read the request body before it and give it a readable
 * Request; read the response body to store it and return a fresh Response), and nothing
 * else. */
export function plumbing() {
  return async (request) => {
    const body = new Uint8Array(await request.arrayBuffer());
    const response = await orderHandler(new Request(request, { body }));
    const bytes = new Uint8Array(await response.arrayBuffer());
    return new Response(bytes, { status: response.status, statusText: response.statusText, headers: response.headers });
  };
}

const storedBody = new TextEncoder().encode(JSON.stringify(answer(0)));
const storedHeaders = [
  ["content-type", "application/json"],
  ["idempotent-replayed", "true"],
];

/** The Fetch floor without the handler: what a wrapper does to answer by itself (a replay, a
 * refusal): read the body, build a Response from stored bytes. */
export function answered() {
  return async (request) => {
    new Uint8Array(await request.arrayBuffer());
    return new Response(storedBody.slice(), { status: 201, headers: storedHeaders });
  };
}

/** The median of `xs`. */
export function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}
