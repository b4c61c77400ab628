// The worker of bench/inside.mjs: the example exactly as it deploys, except that its orders
// object also answers `GET /__inside?route=…&n=…` by serving `n` fresh orders to itself on
// that route, one after another, and answering when they are done. The orders go through the
// object's own fetch, as forwarded ones do, without HTTP or the worker in between.
import { OrderLedger as Ledger } from "../src/worker.js";

export * from "../src/worker.js";
export { default } from "../src/worker.js";

const BODY = '{"amount":4200,"currency":"eur","description":"bench"}';

export class OrderLedger extends Ledger {
  async fetch(request) {
    const url = new URL(request.url);
    if (url.pathname !== "/__inside") return super.fetch(request);
    const route = url.searchParams.get("route");
    const n = Number(url.searchParams.get("n"));
    const run = crypto.randomUUID();
    for (let i = 0; i < n; i++) {
      const order = new Request(`http://orders.local${route}`, {
        method: "POST",
        body: BODY,
        headers: {
          "content-type": "application/json",
          "content-length": String(BODY.length),
          authorization: "Bearer bench",
          "idempotency-key": `"${run}-${i}"`,
        },
      });
      const response = await super.fetch(order);
      await response.arrayBuffer();
      if (response.status !== 201) return new Response(`${route}: ${response.status}`, { status: 500 });
    }
    return new Response("done");
  }
}
