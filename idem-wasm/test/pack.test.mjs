// The package as users get it: `npm pack` (which runs the prepack check), then
// `npm install ./<tarball>` into an empty project outside this repository, and one request
// replayed through the installed package from ESM and from CommonJS.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { packAndInstall } from "./helpers.mjs";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const pkg = JSON.parse(readFileSync(join(root, "package.json"), "utf8"));

// Two requests with one key: the handler runs once and the second answer is the replay.
const requests = (name) => `
const store = new MemoryStore();
let runs = 0;
const handler = withIdempotency(async (request) => {
  runs++;
  return Response.json({ id: runs, order: await request.json() }, { status: 201 });
}, { store, principal: "none" });
const send = () => handler(new Request("http://127.0.0.1/orders", {
  method: "POST",
  headers: { "content-type": "application/json", "idempotency-key": '"${name}-1"' },
  body: '{"amount":900}',
}));
const first = await send();
const retry = await send();
console.log(JSON.stringify({
  runs,
  statuses: [first.status, retry.status],
  replayed: retry.headers.get("idempotent-replayed"),
  bodies: [await first.text(), await retry.text()],
}));
`;

describe("the packed tarball, installed into an empty project", () => {
  let dir;
  let tarball;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), "idem-pack-"));
    let app;
    ({ tarball, app } = packAndInstall(root, dir));
    writeFileSync(
      join(app, "esm.mjs"),
      `import { MemoryStore, withIdempotency } from "idem";\n${requests("esm")}`,
    );
    writeFileSync(
      join(app, "cjs.cjs"),
      `const { MemoryStore, withIdempotency } = require("idem");\n(async () => {${requests("cjs")}})();`,
    );
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  test("the tarball holds the built files, the licenses, the README and nothing else", () => {
    const listed = execFileSync("tar", ["-tzf", tarball], { encoding: "utf8" }).trim().split("\n").sort();
    const expected = [...pkg.files, "README.md", "package.json"]
      .map((f) => `package/${f}`)
      .sort();
    assert.deepEqual(listed, expected);
  });

  test("packing without a build is refused with a clear message", () => {
    // A copy of the package without dist/, as in a fresh clone.
    const bare = join(dir, "bare");
    execFileSync("mkdir", ["-p", join(bare, "scripts")]);
    writeFileSync(join(bare, "package.json"), readFileSync(join(root, "package.json")));
    writeFileSync(join(bare, "scripts", "prepack.mjs"), readFileSync(join(root, "scripts", "prepack.mjs")));
    assert.throws(
      () => execFileSync(process.execPath, ["scripts/prepack.mjs"], { cwd: bare, stdio: "pipe" }),
      (e) => e.status === 1 && /the build is missing \(dist\/idem_wasm_bg\.wasm.*npm run build/s.test(String(e.stderr)),
    );
  });

  for (const [format, file] of [
    ["ESM", "esm.mjs"],
    ["CommonJS", "cjs.cjs"],
  ]) {
    test(`one replayed request through the installed package (${format})`, () => {
      const out = JSON.parse(execFileSync(process.execPath, [file], { cwd: join(dir, "app"), encoding: "utf8" }));
      assert.equal(out.runs, 1, "the handler ran once");
      assert.deepEqual(out.statuses, [201, 201]);
      assert.equal(out.replayed, "true");
      assert.equal(out.bodies[1], out.bodies[0]);
      assert.deepEqual(JSON.parse(out.bodies[0]), { id: 1, order: { amount: 900 } });
    });
  }

  test("@opentelemetry/api is optional: idem runs without it, only idem/opentelemetry needs it", () => {
    // The project installed nothing but the tarball: the peer dependency is absent.
    const app = join(dir, "app");
    assert.throws(() => execFileSync(process.execPath, ["-e", 'require.resolve("@opentelemetry/api")'], { cwd: app, stdio: "pipe" }));
    const script = `
      import("idem").then(async (idem) => {
        let missing = null;
        try { await import("idem/opentelemetry"); } catch (e) { missing = e.code; }
        console.log(JSON.stringify({ loaded: typeof idem.withIdempotency, missing }));
      });`;
    const out = JSON.parse(execFileSync(process.execPath, ["--input-type=module", "-e", script], { cwd: app, encoding: "utf8" }));
    assert.deepEqual(out, { loaded: "function", missing: "ERR_MODULE_NOT_FOUND" });
    for (const file of ["node.js", "node.cjs", "idem_wasm.js", "workerd.js", "web.js"]) {
      const text = readFileSync(join(app, "node_modules", "idem", "dist", file), "utf8");
      assert.ok(!text.includes("@opentelemetry"), `dist/${file} refers to @opentelemetry`);
    }
  });
});
