// `npm pack` / `npm publish` run this first. The package ships the built module and bundles
// from dist/, which only `npm run build` makes (it needs Rust, the wasm32-unknown-unknown
// target and the wasm-bindgen CLI): refuse to pack a package that would be missing them or
// that is older than its sources, and put the license files beside package.json so that npm
// includes them.
import { copyFileSync, existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const repo = resolve(root, "..");
const pkg = JSON.parse(readFileSync(join(root, "package.json"), "utf8"));
const howToBuild =
  "Build it first with `npm run build` in idem-wasm/ (it needs Rust with the wasm32-unknown-unknown " +
  "target and wasm-bindgen-cli; `cargo xtask setup` at the repository root installs both).";

function refuse(why) {
  console.error(`prepack: ${why}\n${howToBuild}`);
  process.exit(1);
}

const built = pkg.files.filter((f) => f.startsWith("dist/"));
const missing = built.filter((f) => !existsSync(join(root, f)));
if (missing.length) refuse(`the build is missing (${missing.join(", ")}).`);

/** The newest modification time of a file or of any file below a directory. */
function newest(path) {
  const st = statSync(path);
  if (!st.isDirectory()) return st.mtimeMs;
  let t = 0;
  for (const e of readdirSync(path)) t = Math.max(t, newest(join(path, e)));
  return t;
}
const sources = ["js", "src", "types", "Cargo.toml", "../idem-core/src", "../idem-core/stores", "../idem-core/Cargo.toml", "../Cargo.lock"];
const oldestBuilt = Math.min(...built.map((f) => statSync(join(root, f)).mtimeMs));
const stale = sources.filter((s) => existsSync(join(root, s)) && newest(join(root, s)) > oldestBuilt);
if (stale.length) refuse(`dist/ is older than its sources (${stale.join(", ")} changed since the build).`);

for (const license of ["LICENSE-MIT", "LICENSE-APACHE"]) copyFileSync(join(repo, license), join(root, license));
