// Private Redis and Postgres servers for the store tests and the benchmark: started from the
// Debian packages (`cargo xtask setup` installs them), listening on 127.0.0.1 on a port the
// OS chose, with their data in a temporary directory. Each is stopped by `stop()`, and
// killed when this process exits in any way, so that a failing test leaves nothing behind.
import { execFileSync, spawn } from "node:child_process";
import { chownSync, existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";

const running = new Set();
process.on("exit", () => {
  for (const child of running) {
    try {
      process.kill(-child.pid, "SIGKILL");
    } catch {}
  }
});
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.once(signal, () => process.exit(130));
}

/** A port the OS chose on 127.0.0.1, free when this returns. */
export async function freePort() {
  const server = createServer();
  await new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", resolve);
  });
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

function missing(what) {
  return new Error(`${what} is not installed: run \`cargo xtask setup\` (it installs the Debian packages redis-server and postgresql)`);
}

/** Starts `command` in a process group of its own (so that stopping it stops its children
 * too) and resolves once `ready()` does, or rejects with its output. */
async function launch(command, args, ready, { timeout = 20_000 } = {}) {
  const child = spawn(command, args, { detached: true, stdio: ["ignore", "pipe", "pipe"] });
  running.add(child);
  let output = "";
  child.stdout.on("data", (d) => (output += d));
  child.stderr.on("data", (d) => (output += d));
  const exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
  exited.then(() => running.delete(child));
  const stop = async (signal = "SIGINT") => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    try {
      process.kill(-child.pid, signal);
    } catch {}
    const timer = setTimeout(() => {
      try {
        process.kill(-child.pid, "SIGKILL");
      } catch {}
    }, 5_000);
    await exited;
    clearTimeout(timer);
  };
  const deadline = Date.now() + timeout;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) {
      throw new Error(`${command} exited before it was ready:\n${output}`);
    }
    if (await ready().catch(() => false)) return { stop, output: () => output };
    if (Date.now() > deadline) {
      await stop("SIGKILL");
      throw new Error(`${command} was not ready after ${timeout} ms:\n${output}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** A TCP connection to 127.0.0.1:port succeeds. */
function listening(port) {
  return new Promise((resolve) => {
    import("node:net").then(({ connect }) => {
      const socket = connect(port, "127.0.0.1");
      socket.once("connect", () => {
        socket.destroy();
        resolve(true);
      });
      socket.once("error", () => resolve(false));
    });
  });
}

/**
 * A private redis-server: `{ url, port, stop() }`. No persistence (`--save ''`,
 * `--appendonly no`); its working directory is a temporary one, removed on stop.
 */
export async function startRedis() {
  if (!existsSync("/usr/bin/redis-server")) throw missing("redis-server");
  const dir = mkdtempSync(join(tmpdir(), "idem-redis-"));
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    try {
      const server = await launch(
        "/usr/bin/redis-server",
        ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir, "--loglevel", "warning"],
        () => listening(port),
      );
      return {
        url: `redis://127.0.0.1:${port}`,
        port,
        stop: async () => {
          await server.stop("SIGTERM");
          rmSync(dir, { recursive: true, force: true });
        },
      };
    } catch (err) {
      // Another process may have taken the port between our check and the server's bind.
      if (attempt >= 3) {
        rmSync(dir, { recursive: true, force: true });
        throw err;
      }
    }
  }
}

/** The newest installed Postgres's bin directory. */
function postgresBin() {
  const base = "/usr/lib/postgresql";
  const versions = existsSync(base) ? readdirSync(base).filter((v) => existsSync(join(base, v, "bin", "postgres"))) : [];
  if (versions.length === 0) throw missing("postgresql");
  versions.sort((a, b) => Number(b) - Number(a));
  return join(base, versions[0], "bin");
}

/**
 * A private Postgres cluster: `{ url, port, stop() }`, initialised in a temporary directory
 * with trust authentication for the user `idem` (the database is `postgres`), without
 * fsync (the tests need its semantics, not its durability). Postgres refuses to run as
 * root: as root, it runs as the `postgres` user the Debian package creates.
 */
export async function startPostgres() {
  const bin = postgresBin();
  const root = process.getuid?.() === 0;
  const asPostgres = (cmd, args) => (root ? ["runuser", ["-u", "postgres", "--", cmd, ...args]] : [cmd, args]);
  const dir = mkdtempSync(join(tmpdir(), "idem-postgres-"));
  const data = join(dir, "data");
  if (root) {
    const uid = Number(execFileSync("id", ["-u", "postgres"], { encoding: "utf8" }).trim());
    const gid = Number(execFileSync("id", ["-g", "postgres"], { encoding: "utf8" }).trim());
    chownSync(dir, uid, gid);
  }
  const [initdb, initArgs] = asPostgres(join(bin, "initdb"), ["-D", data, "-A", "trust", "-U", "idem", "--no-sync", "-E", "UTF8", "--locale=C"]);
  try {
    execFileSync(initdb, initArgs, { stdio: "pipe" });
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    throw new Error(`initdb failed: ${err.stderr ?? err.message}`);
  }
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    const [cmd, args] = asPostgres(join(bin, "postgres"), [
      "-D",
      data,
      "-p",
      String(port),
      "-k",
      dir,
      "-c",
      "listen_addresses=127.0.0.1",
      "-c",
      "fsync=off",
      "-c",
      "synchronous_commit=off",
      "-c",
      "full_page_writes=off",
      "-c",
      "max_connections=200",
    ]);
    try {
      const url = `postgres://idem@127.0.0.1:${port}/postgres`;
      // Ready when it answers a query: it accepts connections while still starting up.
      const server = await launch(cmd, args, async () => {
        if (!(await listening(port))) return false;
        const client = new pg.Client({ connectionString: url });
        try {
          await client.connect();
          await client.query("SELECT 1");
          return true;
        } finally {
          await client.end().catch(() => {});
        }
      });
      return {
        url,
        port,
        stop: async () => {
          // SIGINT: Postgres's fast shutdown (clients are disconnected).
          await server.stop("SIGINT");
          rmSync(dir, { recursive: true, force: true });
        },
      };
    } catch (err) {
      if (attempt >= 3) {
        rmSync(dir, { recursive: true, force: true });
        throw err;
      }
    }
  }
}
