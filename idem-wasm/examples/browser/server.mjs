// The order demo's server: the page (index.html, app.mjs), the idem package's client entry
// for the browser, and a protected `POST /orders` with a count oracle and a switch that drops
// or delays its answers, or loses orders on their way in and delivers them late.
//
//   node server.mjs            listens on 127.0.0.1 on a port the OS chooses (PORT=8080 to
//                              pick one) and prints its URL first; LEASE_MS sets the lease
//
//   GET  /                     the order form (index.html, app.mjs)
//   GET  /idem/*               the package's client entry for browsers: client-web.js
//                              and the lean module it loads, and the full module with its
//                              loader, which it loads when it needs it
//   POST /orders               creates an order, once per Idempotency-Key (withIdempotency)
//   GET  /orders               with Idempotency-Key and Idempotency-Status: what became of
//                              the key (a status query, answered by withIdempotency)
//   GET  /count                {"count": N, "byKey": {key: runs}}: the handler's runs
//   GET  /log                  every request to /orders: its key, and what came of it
//   POST /switch               {"drop": n, "delay": ms, "swallow": n}: drop the next n
//                              answers from /orders (after the order ran and its answer was
//                              stored, or the query was answered), hold each order ms, lose
//                              the next n orders on their way in (kept, their connections
//                              left open)
//   POST /deliver-late         delivers the lost orders to the API now, as a network that
//                              held them would: what each got
//   POST /reset                forget the switch, the log, the counts and the lost orders
//                              (not the keys)
import { createServer } from "node:http";
import { readFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { MemoryStore, idempotencyOf, withIdempotency } from "../../dist/node.js";

const HERE = dirname(fileURLToPath(import.meta.url));
const DIST = join(HERE, "../../dist");

/** Files served, by path: the page, and the client's web entry with what it loads. */
const FILES = {
  "/": [join(HERE, "index.html"), "text/html; charset=utf-8"],
  "/app.mjs": [join(HERE, "app.mjs"), "text/javascript; charset=utf-8"],
  "/idem/client-web.js": [join(DIST, "client-web.js"), "text/javascript; charset=utf-8"],
  "/idem/idem_client_lean_bg.wasm": [join(DIST, "idem_client_lean_bg.wasm"), "application/wasm"],
  "/idem/idem_client_loader.js": [join(DIST, "idem_client_loader.js"), "text/javascript; charset=utf-8"],
  "/idem/idem_client_bg.wasm": [join(DIST, "idem_client_bg.wasm"), "application/wasm"],
};

const PROBLEM = "urn:idem-example:problem:";

function problem(status, slug, title, detail) {
  return Response.json({ type: PROBLEM + slug, title, status, detail }, { status, headers: { "content-type": "application/problem+json" } });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The demo's state: the switch, the count oracle, the log and the orders the network lost
 * on their way in (`held`: each with its request and its connection). */
function freshState() {
  return { drop: 0, delay: 0, swallow: 0, count: 0, byKey: {}, log: [], orders: 0, held: [] };
}

function headersOf(req) {
  const headers = new Headers();
  for (let i = 0; i < req.rawHeaders.length; i += 2) headers.append(req.rawHeaders[i], req.rawHeaders[i + 1]);
  return headers;
}

/** A log entry for a request to /orders and its answer: the key, the status, whether it
 * was a replay, the problem type of a refusal, and for a status query the field it asked
 * with and what the server answered. */
async function logEntry(method, headers, response) {
  const entry = { method, key: headers.get("idempotency-key"), status: response.status, replayed: response.headers.get("idempotent-replayed") === "true" };
  const type = (response.headers.get("content-type") ?? "").split(";")[0].trim();
  if (type === "application/problem+json") entry.problem = (await response.clone().json()).type;
  if (method === "GET") {
    entry.query = headers.get("idempotency-status");
    if (type === "application/vnd.idem.key-status+json") entry.answer = (await response.clone().json()).status;
  }
  return entry;
}

export function createOrderServer() {
  let state = freshState();

  // The protected handler: one run per key (the count oracle), held `delay` ms while the
  // switch says so (a slow back end), then 201 with the order.
  const orders = withIdempotency(
    async (request) => {
      let order;
      try {
        order = await request.json();
      } catch {
        return problem(400, "invalid-order", "The order is not valid JSON", "send a JSON object");
      }
      if (order === null || typeof order !== "object" || typeof order.item !== "string" || !Number.isSafeInteger(order.quantity) || order.quantity < 1) {
        return problem(400, "invalid-order", "The order is not valid", 'send {"item": "…", "quantity": n} with n ≥ 1');
      }
      const key = idempotencyOf(request).key;
      state.count += 1;
      state.byKey[key] = (state.byKey[key] ?? 0) + 1;
      if (state.delay > 0) await sleep(state.delay);
      state.orders += 1;
      const id = `ord_${String(state.orders).padStart(4, "0")}`;
      return Response.json({ id, item: order.item, quantity: order.quantity }, { status: 201 });
    },
    // The lease (LEASE_MS, default 10 s) must outlast the delay the switch sets; the
    // Retry-After of a duplicate in flight is what is left of it, so a short one brings the
    // page's retries back soon.
    { store: new MemoryStore(), principal: "none", lease: Number(process.env.LEASE_MS ?? 10_000) },
  );

  async function route(req, body) {
    const url = new URL(req.url, "http://localhost");
    const file = FILES[url.pathname];
    if (file !== undefined) {
      if (req.method !== "GET") return problem(405, "method-not-allowed", "Method not allowed", "use GET");
      return new Response(await readFile(file[0]), { headers: { "content-type": file[1], "cache-control": "no-store" } });
    }
    switch (url.pathname) {
      case "/orders": {
        // A status query (a GET with Idempotency-Status) is withIdempotency's to answer.
        const query = req.method === "GET" && req.headers["idempotency-status"] !== undefined;
        if (req.method !== "POST" && !query) return problem(405, "method-not-allowed", "Method not allowed", "use POST, or GET with Idempotency-Status (a status query)");
        return orders(new Request(`http://localhost${req.url}`, { method: req.method, headers: headersOf(req), body: query ? undefined : body }));
      }
      case "/count":
        return Response.json({ count: state.count, byKey: state.byKey }, { headers: { "cache-control": "no-store" } });
      case "/log":
        return Response.json(state.log, { headers: { "cache-control": "no-store" } });
      case "/switch": {
        if (req.method !== "POST") return problem(405, "method-not-allowed", "Method not allowed", "use POST");
        let input;
        try {
          input = JSON.parse(body.toString("utf8"));
        } catch {
          input = null;
        }
        const whole = (v) => v === undefined || (Number.isSafeInteger(v) && v >= 0);
        if (input === null || typeof input !== "object" || Array.isArray(input) || !whole(input.drop) || !whole(input.delay) || !whole(input.swallow)) {
          return problem(400, "invalid-switch", "The switch is not valid", 'send {"drop": n, "delay": ms, "swallow": n}, whole numbers ≥ 0');
        }
        state.drop = input.drop ?? state.drop;
        state.delay = input.delay ?? state.delay;
        state.swallow = input.swallow ?? state.swallow;
        return Response.json({ drop: state.drop, delay: state.delay, swallow: state.swallow });
      }
      case "/deliver-late": {
        if (req.method !== "POST") return problem(405, "method-not-allowed", "Method not allowed", "use POST");
        if (body.length > 0) return problem(400, "invalid-delivery", "The delivery takes no input", "send no body: every order held is delivered");
        const held = state.held;
        state.held = [];
        const delivered = [];
        for (const copy of held) {
          // The connection it came on is lost with it; the copy reaches the API now.
          copy.socket.destroy();
          const response = await orders(new Request(`http://localhost${copy.url}`, { method: "POST", headers: copy.headers, body: copy.body }));
          const entry = { ...(await logEntry("POST", copy.headers, response)), late: true };
          state.log.push(entry);
          await response.arrayBuffer();
          delivered.push({ key: entry.key, status: entry.status, problem: entry.problem ?? null });
        }
        return Response.json(delivered, { headers: { "cache-control": "no-store" } });
      }
      case "/reset":
        if (req.method !== "POST") return problem(405, "method-not-allowed", "Method not allowed", "use POST");
        for (const copy of state.held) copy.socket.destroy();
        state = freshState();
        return new Response(null, { status: 204 });
      default:
        return problem(404, "not-found", "Not found", `no route for ${url.pathname}`);
    }
  }

  return createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = Buffer.concat(chunks);
    const toOrders = new URL(req.url, "http://localhost").pathname === "/orders";
    if (toOrders && req.method === "POST" && state.swallow > 0) {
      // Lost on its way in: the API never sees it, and the client waits for an answer that
      // does not come. The copy is kept for /deliver-late.
      state.swallow -= 1;
      const headers = headersOf(req);
      state.held.push({ url: req.url, headers, body, socket: req.socket });
      state.log.push({ method: "POST", key: headers.get("idempotency-key"), status: null, replayed: false, swallowed: true });
      return;
    }
    let response;
    try {
      response = await route(req, body);
    } catch (err) {
      console.error("request failed", err);
      response = problem(500, "internal", "The request failed", "retry with the same key");
    }
    if (toOrders) {
      const entry = await logEntry(req.method, headersOf(req), response);
      state.log.push(entry);
      if (state.drop > 0) {
        // The order ran (or the query was answered) and is stored; the answer is lost on
        // the way back.
        state.drop -= 1;
        entry.dropped = true;
        req.socket.destroy();
        return;
      }
    }
    // One request per connection: a browser retries a request by itself when a reused
    // connection fails before any answer, which would hide what the page does.
    res.shouldKeepAlive = false;
    res.writeHead(response.status, [...response.headers].flat());
    res.end(Buffer.from(await response.arrayBuffer()));
  });
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const server = createOrderServer();
  server.listen(Number(process.env.PORT ?? 0), "127.0.0.1", () => {
    console.log(`http://127.0.0.1:${server.address().port}/`);
  });
}
