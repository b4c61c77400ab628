// `node bench/profile.mjs [route] [requests]`: a CPU profile of the worker under workerd
// while one route takes `requests` POSTs (default: /orders with fresh keys, 3000), 8 at a
// time. The profile is taken through workerd's inspector (the Chrome DevTools protocol) and
// written to idem-worker.cpuprofile in the temporary directory (open it in Chrome DevTools,
// Performance tab); the functions with the most self time are printed. The worker and its
// Durable Objects share one isolate here, so the profile holds both. Build the package with
// `IDEM_NO_MINIFY=1 npm run build` first for readable names.
import { randomUUID } from "node:crypto";
import { writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import WebSocket from "ws";
import { startWorker } from "../test/runtime.mjs";

const route = process.argv[2] ?? "/orders";
const requests = Number(process.argv[3] ?? 3000);
const CONCURRENCY = 8;
const BODY = '{"amount":4200,"currency":"eur","description":"bench"}';

/** A free TCP port on 127.0.0.1 (the inspector needs a number up front). */
function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

/** A DevTools protocol session on `url`: `send(method, params)` resolves to the result. */
async function session(url) {
  const ws = new WebSocket(url);
  await new Promise((resolve, reject) => {
    ws.once("open", resolve);
    ws.once("error", reject);
  });
  let id = 0;
  const pending = new Map();
  ws.on("message", (data) => {
    const message = JSON.parse(data);
    const waiter = pending.get(message.id);
    if (waiter === undefined) return;
    pending.delete(message.id);
    if (message.error) waiter.reject(new Error(message.error.message));
    else waiter.resolve(message.result);
  });
  return {
    send(method, params = {}) {
      id += 1;
      ws.send(JSON.stringify({ id, method, params }));
      return new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
    },
    close: () => ws.close(),
  };
}

const inspectorPort = await freePort();
const worker = await startWorker({ vars: { UNPROTECTED_ROUTE: "on" }, miniflare: { inspectorPort } });
try {
  const targets = await (await fetch(`http://127.0.0.1:${inspectorPort}/json`)).json();
  const target = targets.find((t) => t.webSocketDebuggerUrl) ?? targets[0];
  const cdp = await session(target.webSocketDebuggerUrl);
  const post = () =>
    fetch(`${worker.url}${route}`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: "Bearer bench", "idempotency-key": `"${randomUUID()}"` },
      body: BODY,
    }).then((r) => r.arrayBuffer());
  const drive = async (n) => {
    let next = 0;
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (next++ < n) await post();
      }),
    );
  };
  await drive(300);
  await cdp.send("Profiler.enable");
  await cdp.send("Profiler.setSamplingInterval", { interval: 100 });
  await cdp.send("Profiler.start");
  const started = performance.now();
  await drive(requests);
  const ms = performance.now() - started;
  const { profile } = await cdp.send("Profiler.stop");
  cdp.close();
  const out = join(tmpdir(), "idem-worker.cpuprofile");
  writeFileSync(out, JSON.stringify(profile));
  // Self time per function: samples × the mean interval between them.
  const interval = (profile.endTime - profile.startTime) / profile.samples.length;
  const self = new Map();
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  for (const sample of profile.samples) {
    const { functionName, url, lineNumber } = byId.get(sample).callFrame;
    const name = `${functionName || "(anonymous)"} ${url.split("/").pop()}:${lineNumber + 1}`;
    self.set(name, (self.get(name) ?? 0) + interval);
  }
  const total = [...self.values()].reduce((a, b) => a + b, 0);
  console.log(`${route}: ${requests} requests, ${(requests / (ms / 1000)).toFixed(0)} req/s; ${out}`);
  console.log(`self time per request, of ${(total / requests).toFixed(0)} µs sampled in the isolate:`);
  for (const [name, us] of [...self].sort((a, b) => b[1] - a[1]).slice(0, 25)) {
    console.log(`${(us / requests).toFixed(1).padStart(8)} µs  ${name}`);
  }
} finally {
  await worker.dispose();
}
