// `npm run dev`: the worker under workerd through `wrangler dev --local`, on 127.0.0.1 (port
// 8787 unless `--port P` is given), with Durable Object state persisted in .wrangler/state
// (unless `--persist-to DIR` is given).
// Nothing leaves the machine: telemetry, the update check and the request.cf fetch are off.
// Extra arguments go to wrangler (`npm run dev -- --port 9000 --var IDEM_LEASE_MS:5000`).
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const wrangler = createRequire(import.meta.url).resolve("wrangler/bin/wrangler.js");
const args = process.argv.slice(2);
const given = (name) => args.some((a) => a === name || a.startsWith(`${name}=`));
const defaults = [
  ...(given("--port") ? [] : ["--port", "8787"]),
  ...(given("--persist-to") ? [] : ["--persist-to", ".wrangler/state"]),
];
const child = spawn(
  process.execPath,
  [wrangler, "dev", "--local", "--ip", "127.0.0.1", "--show-interactive-dev-session=false", ...defaults, ...args],
  {
    cwd: join(here, ".."),
    stdio: "inherit",
    env: {
      ...process.env,
      WRANGLER_SEND_METRICS: "false",
      WRANGLER_HIDE_BANNER: "true",
      CLOUDFLARE_CF_FETCH_ENABLED: "false",
    },
  },
);
for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => child.kill(signal));
child.on("exit", (code, signal) => process.exit(code ?? (signal ? 1 : 0)));
