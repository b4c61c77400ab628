// Builds the npm package into dist/. Three modules: the server's (`idem`: the engine, the
// stores' record helpers), the client's (`idem/client`: `idempotentFetch`), so that a
// browser loads none of the engine and a server none of the outbox, and the client's without
// the counter numbering and the payload digest (`lean`), which a browser page loads first:
// it hashes with WebCrypto, and loads the full client module only for counter keys or
// without WebCrypto. For each:
//
//   1. cargo builds idem-wasm for wasm32-unknown-unknown with that side's feature, optimised
//      for size (the settings are passed as CARGO_PROFILE_RELEASE_* so that they apply to
//      this build only);
//   2. for the server's module, the wasm-bindgen CLI (the version pinned in Cargo.toml)
//      writes the `web` glue; the client's modules have one function, bytes in and bytes
//      out, and js/client-module.js is their loader. Every entry shares its side's: Node,
//      Deno, Bun, workerd and edge-light initialise it synchronously (each gets the module
//      its own way), browsers and bundlers with top-level await, and `idem/manual` leaves it
//      to the host;
//   3. wasm-opt from the `binaryen` npm package shrinks the module (Debian's binaryen 108
//      produces modules that fail to load; do not put it first on PATH);
//   4. esbuild bundles and minifies the glue (the server's without its console warnings)
//      with the JavaScript API: one ESM module shared by the ESM entries (for the server,
//      also exported as `idem/manual`), and the CommonJS entry; and minifies each ESM entry. The
//      client's sources are the server's entries and bundles with the module's name and the
//      API's file changed. The browsers' client entry is its own (js/client-web.js), bundled
//      with the API: it loads the lean module, and the full one with its loader and the
//      counter numbering (dist/idem_client_loader.js) when needed;
//   5. the sizes are printed: each module raw, gzip and brotli, what a browser page loads for
//      `idem/client`, and the packed package.
//
// Usage: node scripts/build.mjs [--quiet]
//
// With IDEM_NO_MINIFY=1 the glue is bundled but not minified and the module keeps its name
// section, so that a CPU profile names the package's functions and the module's (for
// profiling only: the sizes printed are then not the package's).
import { execFileSync } from "node:child_process";
import { copyFileSync, cpSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { brotliCompressSync, constants, gzipSync } from "node:zlib";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
/** The ESM entries of `idem` itself, one per runtime (the package's `exports` conditions),
 * each minified on its own: each instantiates the module its own way and re-exports the API. */
const ENTRIES = ["node.js", "workerd.js", "edge-light.js", "deno.js", "bun.js", "web.js"];
/** The two modules: the crate feature each is built with, the name of its glue and module
 * (`<name>.js`, `<name>_bg.wasm`), the file of its API, the prefix of its entries, and the
 * name of its types (`<types>.d.ts`) and of its CommonJS bundle. */
const SIDES = [
  { feature: "server", name: "idem_wasm", api: "./index.js", prefix: "", types: "index", cjs: "node.cjs" },
  { feature: "client-full", name: "idem_client", api: "./client-full.js", prefix: "client-", types: "client", cjs: "client.cjs" },
];
/** The browsers' client module: built and optimised as the others, bundled by itself. */
const LEAN = { feature: "client", name: "idem_client_lean" };
/** The entries beside the main one: `idem/<name>`, from js/<name>.js and types/<name>.d.ts. */
const EXTRA_ENTRIES = ["redis", "postgres", "store-tests", "hono", "express", "fastify", "nestjs", "opentelemetry"];
const dist = join(root, "dist");
const quiet = process.argv.includes("--quiet");
const cargo = process.env.CARGO || "cargo";

function run(cmd, args, opts = {}) {
  execFileSync(cmd, args, { stdio: ["ignore", quiet ? "ignore" : "inherit", "inherit"], cwd: root, ...opts });
}

// 1. The module, built for size.
const sizeProfile = {
  CARGO_PROFILE_RELEASE_OPT_LEVEL: "z",
  CARGO_PROFILE_RELEASE_LTO: "fat",
  CARGO_PROFILE_RELEASE_CODEGEN_UNITS: "1",
  CARGO_PROFILE_RELEASE_PANIC: "abort",
  CARGO_PROFILE_RELEASE_DEBUG: "0",
};
// The server's hot code of every request is optimised for speed rather than size: SHA-256
// (fingerprints) and the allocator, for under 1 KB gzip, and idem-core (JSON
// canonicalisation, decisions), for about 21 KB gzip against "z" (12.6 KB against "s"). At
// "z", `Idempotency#handle` takes about 1.7 times as long on a fresh request with a
// 200-byte JSON body, in-process and in an Express app under load alike; at "s", about 1.1
// times. The client's module stays at "z" throughout: it hashes one payload per logical
// request and decides a few steps, where the speed is not measurable next to the network.
const speed = [
  "--config",
  "profile.release.package.sha2.opt-level=3",
  "--config",
  "profile.release.package.dlmalloc.opt-level=3",
  "--config",
  "profile.release.package.idem-core.opt-level=2",
];
// Source paths end up in the module (panic locations): shorten the long, machine-specific
// prefixes of the dependency sources and of this repository.
const cargoHome = process.env.CARGO_HOME || join(homedir(), ".cargo");
const registry = join(cargoHome, "registry", "src");
const prefixes = [resolve(root, "..") + "/"];
if (existsSync(registry)) for (const d of readdirSync(registry)) prefixes.push(join(registry, d) + "/");
const rustflags = [process.env.RUSTFLAGS ?? "", ...prefixes.map((p) => `--remap-path-prefix=${p}=`)].join(" ").trim();
const meta = JSON.parse(
  execFileSync(cargo, ["metadata", "--format-version", "1", "--no-deps"], { cwd: root, encoding: "utf8" }),
);
const built = join(meta.target_directory, "wasm32-unknown-unknown", "release", "idem_wasm.wasm");
const bindgenOut = join(meta.target_directory, "idem-wasm-bindgen");
rmSync(bindgenOut, { recursive: true, force: true });
rmSync(dist, { recursive: true, force: true });
mkdirSync(dist, { recursive: true });
// `cargo xtask` passes the path of the CLI it installed; otherwise it is looked up on PATH.
const profiling = Boolean(process.env.IDEM_NO_MINIFY);
const wasmOpt = join(root, "node_modules", ".bin", "wasm-opt");
for (const side of [...SIDES, LEAN]) {
  run(
    cargo,
    [
      "build",
      "--quiet",
      "-p",
      "idem-wasm",
      "--no-default-features",
      "--features",
      side.feature,
      "--target",
      "wasm32-unknown-unknown",
      "--release",
      ...(side.feature === "server" ? speed : []),
    ],
    { env: { ...process.env, ...sizeProfile, RUSTFLAGS: rustflags } },
  );

  // 2. The server's glue. The client's modules need none: their one function takes and
  //    answers bytes, and js/client-module.js instantiates them (src/exports.rs).
  const server = side.feature === "server";
  if (server) run(process.env.WASM_BINDGEN || "wasm-bindgen", [
    "--target",
    "web",
    "--no-typescript",
    ...(profiling ? [] : ["--remove-name-section"]),
    "--remove-producers-section",
    "--out-name",
    side.name,
    "--out-dir",
    bindgenOut,
    built,
  ]);

  // 3. The optimiser.
  run(wasmOpt, [
    // The client's modules take binaryen's speed passes at their highest level, -O4: larger
    // raw (about 0.6%), smaller compressed (about 1% gzip). The server's keeps -Oz.
    server ? "-Oz" : "-O4",
    "--converge",
    "--enable-bulk-memory",
    "--enable-nontrapping-float-to-int",
    "--enable-sign-ext",
    "--enable-reference-types",
    "--enable-multivalue",
    "--enable-mutable-globals",
    ...(profiling ? ["--debuginfo"] : ["--strip-debug"]),
    "--strip-producers",
    // The features the module was compiled for, a section for linkers: no runtime reads it.
    "--strip-target-features",
    server ? join(bindgenOut, `${side.name}_bg.wasm`) : built,
    "-o",
    join(dist, `${side.name}_bg.wasm`),
  ]);
}

// 4. The JavaScript: the glue and the API sources side by side, bundled and minified into
//    one ESM module per side (dist/idem_wasm.js and dist/idem_client.js, shared by that
//    side's ESM entries) and one CommonJS bundle (dist/node.cjs, dist/client.cjs); the ESM
//    entries are minified one by one, and for the client with the module's name changed.
const stage = join(meta.target_directory, "idem-wasm-stage");
rmSync(stage, { recursive: true, force: true });
mkdirSync(stage, { recursive: true });
writeFileSync(join(stage, "idem_wasm.js"), withoutWarnings(readFileSync(join(bindgenOut, "idem_wasm.js"), "utf8")));
// The client's sources import its loader as ./client-module.js; the entries they share with
// the server's import it as the server's glue, renamed (`forSide`).
writeFileSync(join(stage, "idem_client.js"), 'export { default, initSync, call } from "./client-module.js";\n');
for (const f of readdirSync(join(root, "js"))) {
  if (f.endsWith(".js")) copyFileSync(join(root, "js", f), join(stage, f));
}
cpSync(join(root, "js", "client-codes"), join(stage, "client-codes"), { recursive: true });
/** The glue without its three console warnings (a module passed the deprecated way to
 * `initSync` or `init`; a module served without the `application/wasm` type, for which the
 * glue falls back to `WebAssembly.instantiate` all the same), each one line of the glue
 * wasm-bindgen 0.2.129 writes: text a page would load for messages it never needs. The build
 * stops if they are not where they were, so that another CLI's glue is looked at again. */
function withoutWarnings(glue) {
  const lines = glue.split("\n");
  const kept = lines.filter((l) => !/^\s*console\.warn\(.*\);?$/.test(l));
  if (lines.length - kept.length !== 3 || kept.some((l) => l.includes("console."))) {
    throw new Error("the wasm-bindgen glue's console warnings are not the three lines this build removes");
  }
  return kept.join("\n");
}

/** A server source as the client's: its module and its API swapped for the client's. */
const forSide = (side, text) => text.replaceAll("idem_wasm", side.name).replaceAll('"./index.js"', `"${side.api}"`);
const esbuild = join(root, "node_modules", ".bin", "esbuild");
const bundle = ["--bundle", ...(profiling ? [] : ["--minify"]), "--legal-comments=none", "--log-level=warning"];
for (const side of SIDES) {
  for (const f of ["bundle.js", "node-cjs.js"]) {
    writeFileSync(join(stage, `${side.prefix}${f}`), forSide(side, readFileSync(join(root, "js", f), "utf8")));
  }
  run(esbuild, [
    join(stage, `${side.prefix}bundle.js`),
    ...bundle,
    "--format=esm",
    "--target=es2022",
    `--outfile=${join(dist, `${side.name}.js`)}`,
  ]);
  run(esbuild, [
    join(stage, `${side.prefix}node-cjs.js`),
    ...bundle,
    "--format=cjs",
    "--platform=node",
    "--target=node18",
    "--log-override:empty-import-meta=silent",
    `--outfile=${join(dist, side.cjs)}`,
  ]);
  // The entries, minified one by one (they stay separate files, each importing the bundle),
  // in the syntax they are written in (Deno's entry imports in the source phase).
  // The browsers' client entry is js/client-web.js, below.
  for (const f of side.prefix === "" ? ENTRIES : ENTRIES.filter((e) => e !== "web.js")) {
    const entry = join(stage, `entry-${side.prefix}${f}`);
    writeFileSync(entry, forSide(side, readFileSync(join(root, "js", f), "utf8")));
    const out = `--outfile=${join(dist, `${side.prefix}${f}`)}`;
    run(esbuild, [entry, ...(profiling ? [] : ["--minify"]), "--legal-comments=none", "--log-level=warning", "--format=esm", "--target=esnext", out]);
  }
  copyFileSync(join(root, "types", `${side.types}.d.ts`), join(dist, `${side.types}.d.ts`));
  copyFileSync(join(root, "types", `${side.types}.d.ts`), join(dist, `${side.types}.d.cts`));
}
// The browsers' client: its entry, bundled with the API and the loader (for the lean module),
// and the loader with the counter numbering (js/client-loader.js), which the entry imports
// when it needs the full module.
run(esbuild, [join(stage, "client-web.js"), ...bundle, "--format=esm", "--target=es2022", "--external:./idem_client_loader.js", `--outfile=${join(dist, "client-web.js")}`]);
run(esbuild, [join(stage, "client-loader.js"), ...bundle, "--format=esm", "--target=es2022", `--outfile=${join(dist, "idem_client_loader.js")}`]);

// `idem/manual` is dist/idem_wasm.js itself (the API and `initSync`, nothing instantiated),
// and `idem/client/manual` dist/idem_client.js; only their types are files of their own.
copyFileSync(join(root, "types", "manual.d.ts"), join(dist, "manual.d.ts"));
copyFileSync(join(root, "types", "client-manual.d.ts"), join(dist, "client-manual.d.ts"));
// The entries beside the main one (stores, adapters, the store tests), ESM and CommonJS. Each
// imports the main entry as "idem", so that they share its one instance of the module, and
// leaves its client library (ioredis, pg, hono, express, fastify, NestJS, rxjs, the
// OpenTelemetry API) to the application. The Lua script and the SQL come from
// idem-core/stores/, the one copy the Rust stores read too.
const external = ["idem", "ioredis", "pg", "hono", "express", "fastify", "@nestjs/*", "rxjs", "@opentelemetry/api", "node:*"].map((e) => `--external:${e}`);
const loaders = ["--loader:.lua=text", "--loader:.sql=text"];
for (const entry of EXTRA_ENTRIES) {
  const src = join(root, "js", `${entry}.js`);
  const common = [src, "--bundle", "--legal-comments=none", "--log-level=warning", ...external, ...loaders];
  run(esbuild, [...common, "--format=esm", "--target=es2022", `--outfile=${join(dist, `${entry}.js`)}`]);
  run(esbuild, [...common, "--format=cjs", "--platform=node", "--target=node18", `--outfile=${join(dist, `${entry}.cjs`)}`]);
  copyFileSync(join(root, "types", `${entry}.d.ts`), join(dist, `${entry}.d.ts`));
  copyFileSync(join(root, "types", `${entry}.d.ts`), join(dist, `${entry}.d.cts`));
}

// 5. Sizes.
const gz = (b) => gzipSync(b, { level: 9 }).length;
const br = (b) => brotliCompressSync(b, { params: { [constants.BROTLI_PARAM_QUALITY]: 11 } }).length;
const pkg = JSON.parse(readFileSync(join(root, "package.json"), "utf8"));
// The code the package ships (the license files beside it are added by `npm pack`).
const shipped = pkg.files.filter((f) => f.startsWith("dist/"));
let raw = 0;
let gzip = 0;
let brotli = 0;
for (const f of shipped) {
  const b = readFileSync(join(root, f));
  raw += b.length;
  gzip += gz(b);
  brotli += br(b);
}
const sizes = { package: { files: shipped.length, raw, gzip, brotli } };
const files = (names) => {
  const bytes = names.map((f) => readFileSync(join(dist, f)));
  return {
    raw: bytes.reduce((n, b) => n + b.length, 0),
    gzip: bytes.reduce((n, b) => n + gz(b), 0),
    brotli: bytes.reduce((n, b) => n + br(b), 0),
  };
};
sizes.server = files(["idem_wasm_bg.wasm"]);
sizes.client = files(["idem_client_bg.wasm"]);
sizes.clientLean = files(["idem_client_lean_bg.wasm"]);
// What a browser loads for `idem/client`: its entry (with the API and the loader) and the
// lean module; and what it loads besides for counter keys or without WebCrypto.
sizes.clientPage = files(["client-web.js", "idem_client_lean_bg.wasm"]);
sizes.clientPageFull = files(["idem_client_loader.js", "idem_client_bg.wasm"]);
writeFileSync(join(dist, "sizes.json"), JSON.stringify(sizes, null, 2) + "\n");
const kib = (n) => `${(n / 1024).toFixed(1)} KiB`;
const line = (s) => `${s.raw} B raw (${kib(s.raw)}), ${s.gzip} B gzip (${kib(s.gzip)}), ${s.brotli} B brotli (${kib(s.brotli)})`;
console.log(`idem_wasm_bg.wasm (server): ${line(sizes.server)}`);
console.log(`idem_client_bg.wasm (client-full): ${line(sizes.client)}`);
console.log(`idem_client_lean_bg.wasm (client): ${line(sizes.clientLean)}`);
console.log(`a page with idem/client (client-web.js, the lean module): ${line(sizes.clientPage)}`);
console.log(`  and for counter keys or without WebCrypto (idem_client_loader.js, the full module): ${line(sizes.clientPageFull)}`);
console.log(`package (${shipped.length} files, each compressed): ${line(sizes.package)}`);
