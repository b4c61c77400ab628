// `npm run bench:http-cost`: where an Express app's CPU goes on a fresh guarded request, step
// by step, as the app's own CPU time per answered request (Linux only: read from /proc).
// Build first (`npm run build`).
//
// Usage: node bench/http-cost.mjs [SECONDS] [ROUNDS]   (4-second runs, 5 rounds by default)
//
// The app (a child process, `node bench/http-cost.mjs serve`): one Express 5 app with the
// order route of bench/http.mjs on five paths, each adding one step of what `idem/express`
// does on a fresh key to the one before:
//   bare       express.json(), the route
//   read       a middleware mounted on the path that reads the body and parses it as
//              idem/express does (js/body.js, js/adapter.js); express.json() then has
//              nothing to do
//   patched    and replaces res.write, res.end and res.writeHead with functions that call
//              the originals, as a response capture must
//   captured   and holds the route's answer back (js/node-response.js `capture`) and sends
//              it afterwards (`send`), as idem/express does with the stored answer
//   idem       idem/express over a MemoryStore: all of the above, and the request through
//              `Idempotency#handle`
// The load (this process): autocannon, 16 connections, a new Idempotency-Key on every
// request, the nested 200-byte body of bench/http.mjs. The paths take turns for ROUNDS rounds
// after a 1-second warm-up each; each figure is the median over the rounds of the app's CPU
// time (user and system) divided by the requests answered, and each step is the difference
// of two medians. The load generator shares the machine's cores, which moves requests per
// second far more than the app's CPU time per request.
import { readFileSync } from "node:fs";
import { serveForLoad, startApp } from "./app-process.mjs";
import { median, nestedOrder as ORDER } from "./workload.mjs";

const CONNECTIONS = 16;
const STEPS = [
  { path: "bare", what: "the bare route" },
  { path: "read", what: "a middleware on the path that reads and parses the body" },
  { path: "patched", what: "res.write, res.end and res.writeHead replaced per request" },
  { path: "captured", what: "the answer held back, then sent again" },
  { path: "idem", what: "the request through Idempotency#handle (idem/express)" },
];

if (process.argv[2] === "serve") await serve();
else await load();

async function serve() {
  const { default: express } = await import("express");
  const { MemoryStore } = await import("idem");
  const { idempotency } = await import("idem/express");
  const { readNodeBody } = await import("../js/adapter.js");
  const { capture, send } = await import("../js/node-response.js");
  // What the steps before `idem` ask of the engine: no body limit, no refusal hook.
  const noEngine = { refuseBody: () => undefined, mappedRefusal: () => undefined };

  let runs = 0;
  const order = (req, res) => {
    runs++;
    res.status(201).json({ id: `ord_${runs}`, status: "created", total: req.body.total });
  };
  const read = (req) => readNodeBody(noEngine, req);
  const patch = (res) => {
    const { write, end, writeHead } = res;
    res.write = function (...args) {
      return write.apply(this, args);
    };
    res.end = function (...args) {
      return end.apply(this, args);
    };
    res.writeHead = function (...args) {
      return writeHead.apply(this, args);
    };
  };

  const app = express();
  app.post("/bare/orders", express.json(), order);
  app.use("/read", (req, res, next) => read(req).then(() => next(), next));
  app.post("/read/orders", express.json(), order);
  app.use("/patched", (req, res, next) =>
    read(req).then(() => {
      patch(res);
      next();
    }, next),
  );
  app.post("/patched/orders", express.json(), order);
  app.use("/captured", async (req, res, next) => {
    try {
      await read(req);
      // No size limit and no lease (no context): what idem/express adds to them is idem's.
      const held = capture(res, Infinity);
      next();
      const answer = await held.answer;
      await send(res, { status: answer.status, headers: answer.headers.flat(), body: answer.body }, noEngine, held);
    } catch (err) {
      next(err);
    }
  });
  app.post("/captured/orders", express.json(), order);
  app.use("/idem", idempotency({ store: new MemoryStore(), principal: "none" }));
  app.post("/idem/orders", express.json(), order);

  serveForLoad(app);
}

async function load() {
  const SECONDS = Number(process.argv[2] ?? 4);
  const ROUNDS = Number(process.argv[3] ?? 5);
  const { default: autocannon } = await import("autocannon");
  const { app, port } = await startApp(import.meta.url);
  /** The app's CPU time so far (user and system), in µs. */
  const cpu = () => {
    const fields = readFileSync(`/proc/${app.pid}/stat`, "utf8").split(") ")[1].split(" ");
    return (Number(fields[11]) + Number(fields[12])) * 10_000;
  };
  const headers = { "content-type": "application/json" };
  let fresh = 0;
  let failed = false;
  const samples = Object.fromEntries(STEPS.map((s) => [s.path, []]));
  for (let round = -1; round < ROUNDS; round++) {
    for (const step of STEPS) {
      const before = cpu();
      const result = await autocannon({
        url: `http://127.0.0.1:${port}`,
        connections: CONNECTIONS,
        duration: round < 0 ? 1 : SECONDS,
        requests: [
          {
            method: "POST",
            path: `/${step.path}/orders`,
            headers,
            body: ORDER,
            setupRequest: (req) => {
              req.headers = { ...headers, "idempotency-key": `"f-${fresh++}"` };
              return req;
            },
          },
        ],
      });
      if (result.non2xx + result.errors + result.timeouts > 0) {
        failed = true;
        console.log(`CHECK FAILED: /${step.path}/orders: ${result.non2xx} non-2xx, ${result.errors} errors, ${result.timeouts} timeouts`);
      }
      if (round >= 0) samples[step.path].push((cpu() - before) / result["2xx"]);
    }
  }
  app.disconnect();

  console.log(`Express app CPU per answered fresh request, Node ${process.version}, ${ROUNDS} rounds of ${SECONDS} s, median (µs)`);
  let previous;
  for (const step of STEPS) {
    const m = median(samples[step.path]);
    const d = previous === undefined ? undefined : Math.round(m - previous);
    const added = d === undefined ? "" : `${d >= 0 ? "+" : ""}${d}`;
    console.log(`  ${step.path.padEnd(9)}${m.toFixed(0).padStart(5)}${added.padStart(7)}  ${step.what}`);
    previous = m;
  }
  if (failed) process.exitCode = 1;
}
