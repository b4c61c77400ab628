// The conformance suite's HTML report, opened in the same headless Chromium: a run against
// the reference server with its `no-lock` fault, whose concurrent-duplicates case is unsafe.
// The pages render with nothing loaded from elsewhere, and the timeline shows every
// connection of the round. `IDEM_SCREENSHOTS=1 npm test` writes the screenshot in
// conformance/README.md (conformance/docs/html-report.png).
import { test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { conformanceBinary, runProcess } from "../../../test/conformance.mjs";
import { EXAMPLE_DIR, launchChromium, removeDir, tempDir } from "./browser.mjs";

test("the HTML report of a no-lock run renders offline in Chromium, with the unsafe round's timeline", { timeout: 120_000 }, async (t) => {
  const dir = tempDir("idem-report-");
  const profile = tempDir();
  let browser;
  try {
    const report = join(dir, "report");
    const run = await runProcess(conformanceBinary(), ["run", "--quiet", "--fault", "no-lock", "--html", report], 90_000);
    assert.equal(run.code, 2, `no-lock is unsafe (exit 2): ${run.stderr}`);
    browser = await launchChromium(profile);
    const page = await browser.newPage();
    await page.setViewport({ width: 1000, height: 860 });
    // Only file: URLs may load: the report is self-contained.
    const elsewhere = [];
    page.on("request", (r) => {
      if (!r.url().startsWith("file:")) elsewhere.push(r.url());
    });
    await page.goto(`file://${join(report, "index.html")}`, { waitUntil: "load" });
    const verdict = await page.$eval('a[href="concurrent-1.html"]', (a) => a.closest("tr").querySelector(".badge").textContent);
    assert.equal(verdict, "unsafe");
    await page.click('a[href="concurrent-1.html"]');
    await page.waitForSelector("svg");
    const lanes = await page.$$eval("svg text[text-anchor=end]", (texts) => texts.map((x) => x.textContent));
    assert.ok(lanes.length >= 2 && lanes.every((l) => /^connection \d+$/.test(l)), `lanes: ${lanes}`);
    const box = await page.$eval("svg", (svg) => svg.getBoundingClientRect().width);
    assert.ok(box > 500, `the timeline is drawn (${box} px wide)`);
    assert.match(await page.$eval("h3", (h) => h.textContent), /Round 1: the count oracle saw \d+ executions/);
    assert.deepEqual(elsewhere, [], "nothing is loaded from elsewhere");
    t.diagnostic(`concurrent/1: ${lanes.length} lanes in round 1`);
    if (process.env.IDEM_SCREENSHOTS === "1") {
      await page.screenshot({ path: join(EXAMPLE_DIR, "../../../conformance/docs/html-report.png") });
    }
  } finally {
    await browser?.close().catch(() => {});
    removeDir(profile);
    removeDir(dir);
  }
});
