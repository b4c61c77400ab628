// The app process of the HTTP benchmarks (bench/http.mjs, bench/http-cost.mjs): each file
// runs itself again as `node FILE serve`, which serves its Express app on an OS-chosen port of
// 127.0.0.1 and stops when the load process disconnects.
import { fork } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";

/** Starts `file` (an `import.meta.url`) as the app process; resolves to it and its port. */
export async function startApp(file) {
  const app = fork(fileURLToPath(file), ["serve"], { stdio: ["ignore", "inherit", "inherit", "ipc"] });
  const [{ port }] = await once(app, "message");
  return { app, port };
}

/** In the app process: serves `app`, tells the load process its port, and stops with it. */
export function serveForLoad(app) {
  const server = app.listen(0, "127.0.0.1", () => process.send({ port: server.address().port }));
  process.on("disconnect", () => server.close(() => process.exit(0)));
  server.keepAliveTimeout = 60_000;
}
