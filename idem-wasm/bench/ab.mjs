// `node bench/ab.mjs <dist A> <dist B> [R]`: two builds of the package side by side in one
// process, for a change's before and after. Each build's `Idempotency#handle` serves the
// workload of bench/bench.mjs (5,000 requests with fresh keys, the same keys again, then the
// same keys with a changed body; a 90-byte JSON body encoded inside the timed loop) on a
// store of its own, and the builds take turns for R rounds (default 11), the first one
// alternating, so that a machine that slows down slows both. Prints the median µs per
// request of each build, and the median of the rounds' own B/A ratios with their middle half.
//
// A build of another commit: `git worktree add /tmp/before <commit>`, link this
// node_modules into its idem-wasm, `npm run build` there, and pass its dist.
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [a, b] = process.argv.slice(2, 4);
if (a === undefined || b === undefined) {
  console.error("usage: node bench/ab.mjs <dist A> <dist B> [rounds]");
  process.exit(2);
}
const ROUNDS = Number(process.argv[4] ?? 11);
const N = 5000;
const builds = await Promise.all([a, b].map((dir) => import(pathToFileURL(resolve(dir, "node.js")).href)));
const encoder = new TextEncoder();
const bodyOf = (i, changed) =>
  JSON.stringify({ amount: changed ? 2000 + i : 1000 + i, currency: "eur", customer: `cus_${i}`, note: "benchmark order" });
const answer = (i) => JSON.stringify({ id: `ord_${i}`, status: "created" });
const phases = ["fresh", "replay", "mismatch"];

async function round(idem) {
  const out = {};
  for (const phase of phases) {
    const start = process.hrtime.bigint();
    for (let i = 0; i < N; i++) {
      const reply = await idem.handle(
        { method: "POST", target: "/orders", key: `"k-${i}"`, contentType: "application/json", body: encoder.encode(bodyOf(i, phase === "mismatch")) },
        () => ({ status: 201, headers: [["content-type", "application/json"]], body: answer(i) }),
      );
      if (reply.status !== (phase === "mismatch" ? 422 : 201)) throw new Error(`${phase}: ${reply.status}`);
    }
    out[phase] = Number(process.hrtime.bigint() - start) / 1e3 / N;
  }
  return out;
}

const samples = [[], []];
for (let r = 0; r < ROUNDS; r++) {
  for (const which of r % 2 ? [1, 0] : [0, 1]) {
    const { Idempotency, MemoryStore } = builds[which];
    samples[which].push(await round(new Idempotency({ store: new MemoryStore(), principal: "none" })));
  }
}
const sorted = (xs) => [...xs].sort((x, y) => x - y);
const median = (xs) => sorted(xs)[xs.length >> 1];
// B/A is the median of each round's own ratio: the two builds of a round ran back to back, so
// a machine that slows down between rounds moves both sides of a ratio, not one median.
// The middle half of the rounds' ratios is printed beside it: a change inside that range is
// not shown by this run.
console.log(`µs per request, median of ${ROUNDS} rounds of ${N}; A = ${a}, B = ${b}`);
for (const phase of phases) {
  const [ma, mb] = samples.map((s) => median(s.map((x) => x[phase])));
  const ratios = sorted(samples[1].map((x, r) => x[phase] / samples[0][r][phase]));
  const q = (f) => ratios[Math.floor(f * (ratios.length - 1))].toFixed(3);
  console.log(
    `${phase.padEnd(9)} A ${ma.toFixed(2).padStart(7)}  B ${mb.toFixed(2).padStart(7)}  B/A ${median(ratios).toFixed(3)} [${q(0.25)}–${q(0.75)}]`,
  );
}
