// The worker of bench/inside.mjs: the example exactly as it deploys, except that its orders
// object also answers `GET /__inside?route=…&n=…` by serving `n` fresh orders to itself on
// that route, one after another, and answering when they are done. The orders go through the
// object's own fetch, as forwarded ones do, without HTTP or the worker in between.
//
// Two more routes are floors that split a protected order's cost. Both run the order handler
// with its writes going straight to the object's storage, as the unprotected route does:
// `floor:fetch` does only what any Fetch-standard wrapper must do before a handler (read the
// body, and give the handler a request it can still read), and `floor:memory` is
// `withIdempotency` over a `MemoryStore` (all of the idempotency work, with the records in
// memory instead of in the object's storage).
import { MemoryStore, withIdempotency } from "../../../dist/workerd.js";
import { createOrder } from "../src/orders.js";
import { OrderLedger as Ledger } from "../src/worker.js";

export * from "../src/worker.js";
export { default } from "../src/worker.js";

const BODY = '{"amount":4200,"currency":"eur","description":"bench"}';

export class OrderLedger extends Ledger {
  #floors = null;

  /** The floor routes' handlers, built on first use (one MemoryStore for the object). */
  #floor(route) {
    if (this.#floors === null) {
      const handler = (request) => createOrder(request, 0, () => this.record(), { storage: this.ctx.storage });
      this.#floors = {
        "floor:fetch": async (request) => {
          const body = new Uint8Array(await request.arrayBuffer());
          return handler(new Request(request, { body }));
        },
        "floor:memory": withIdempotency(handler, {
          store: new MemoryStore(),
          principal: (request) => request.headers.get("authorization"),
        }),
      };
    }
    return this.#floors[route];
  }

  async fetch(request) {
    const url = new URL(request.url);
    if (url.pathname !== "/__inside") return super.fetch(request);
    const route = url.searchParams.get("route");
    const floor = this.#floor(route);
    const n = Number(url.searchParams.get("n"));
    const run = crypto.randomUUID();
    for (let i = 0; i < n; i++) {
      const order = new Request(`http://orders.local${floor === undefined ? route : "/orders"}`, {
        method: "POST",
        body: BODY,
        headers: {
          "content-type": "application/json",
          "content-length": String(BODY.length),
          authorization: "Bearer bench",
          "idempotency-key": `"${run}-${i}"`,
        },
      });
      const response = await (floor === undefined ? super.fetch(order) : floor(order));
      await response.arrayBuffer();
      if (response.status !== 201) return new Response(`${route}: ${response.status}`, { status: 500 });
    }
    return new Response("done");
  }
}
