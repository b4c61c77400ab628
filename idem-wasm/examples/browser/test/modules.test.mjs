// What a page loads for idem/client, in headless Chromium against the demo server: the module
// without the counter numbering and the payload digest, and nothing more while WebCrypto
// hashes its payloads; the full module, with its loader, only on a page that is not a secure
// context (no WebCrypto: the module hashes) or that sends counter keys. Either way each order
// is placed once, and its retry after a lost answer is recognised as the same payload; two
// tabs that number counter keys with one persisted record never take the same number.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { getJson, launchChromium, postJson, removeDir, startServer, tempDir } from "./browser.mjs";

const LEAN = "/idem/idem_client_lean_bg.wasm";
const FULL = ["/idem/idem_client_loader.js", "/idem/idem_client_bg.wasm"];

// One server and one browser for the file, a new page for each test: a page loads its
// modules afresh. `idem.test` resolves to 127.0.0.1, so that a page from it is not a secure
// context, as a page over plain HTTP from any host but a loopback one is not.
let server;
let browser;
let profile;
before(async () => {
  server = await startServer();
  profile = tempDir();
  browser = await launchChromium(profile, ["--host-resolver-rules=MAP idem.test 127.0.0.1"]);
});
after(async () => {
  await browser?.close().catch(() => {});
  await server?.stop();
  if (profile) removeDir(profile);
});

/** Opens the order page from `host` in a new page and runs `fn(page, loaded)`, `loaded` the
 * paths the page fetched; closes the page whatever happens. */
async function withPage(fn, host = "127.0.0.1") {
  const page = await browser.newPage();
  try {
    const loaded = [];
    page.on("request", (r) => loaded.push(new URL(r.url()).pathname));
    await page.goto(`${server.url.replace("127.0.0.1", host)}/`, { waitUntil: "load" });
    await page.waitForSelector("body[data-ready]", { timeout: 15_000 });
    await fn(page, loaded);
  } finally {
    await page.close().catch(() => {});
  }
}

/** Sends an order from the page with idempotentFetch and `options`: its outcome and key. */
function send(page, options) {
  return page.evaluate(async (options) => {
    const { idempotentFetch } = await import("/idem/client-web.js");
    const init = { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ item: "grinder", quantity: 1 }) };
    const result = await idempotentFetch("/orders", init, { retry: { base: 5, cap: 20 }, ...options });
    return { outcome: result.outcome, key: result.key };
  }, options);
}

/** The orders the server has run so far. */
const count = async () => (await getJson(`${server.url}/count`)).count;

test("a secure page with UUID keys loads the lean module and nothing more", { timeout: 60_000 }, async () => {
  await withPage(async (page, loaded) => {
    assert.equal(await page.evaluate(() => window.isSecureContext), true);
    const before = await count();
    await postJson(`${server.url}/switch`, { drop: 1 });
    assert.equal((await send(page, {})).outcome, "completed");
    assert.ok(loaded.includes(LEAN), loaded.join(" "));
    for (const path of FULL) assert.ok(!loaded.includes(path), `${path} was loaded: ${loaded.join(" ")}`);
    assert.equal(await count(), before + 1, "the retry replayed the order");
  });
});

test("a page that is not a secure context hashes with the full module, and its order is placed once", { timeout: 60_000 }, async () => {
  await withPage(async (page, loaded) => {
    assert.equal(await page.evaluate(() => [window.isSecureContext, typeof crypto.subtle].join()), "false,undefined");
    const before = await count();
    await postJson(`${server.url}/switch`, { drop: 1 });
    assert.equal((await send(page, {})).outcome, "completed");
    for (const path of [LEAN, ...FULL]) assert.ok(loaded.includes(path), `${path} was not loaded: ${loaded.join(" ")}`);
    assert.equal(await count(), before + 1, "the retry replayed the order");
  }, "idem.test");
});

test("counter keys: the page loads the full module, which numbers them", { timeout: 60_000 }, async () => {
  await withPage(async (page, loaded) => {
    const before = await count();
    const counter = { client: "page-1", epoch: "7" };
    const first = await send(page, { keyKind: "counter", counter });
    const second = await send(page, { keyKind: "counter", counter });
    assert.deepEqual([first.outcome, second.outcome], ["completed", "completed"]);
    assert.notEqual(first.key, second.key);
    for (const key of [first.key, second.key]) assert.match(key, /^page-1:7:\d+$/);
    for (const path of FULL) assert.ok(loaded.includes(path), `${path} was not loaded: ${loaded.join(" ")}`);
    assert.equal(await count(), before + 2);
  });
});

test("counter keys in two tabs over one IndexedDB: every order its own number, none replayed as another's (IDEM-CLIENT-9)", { timeout: 60_000 }, async () => {
  // Two pages of the origin, each sending orders with one counter client whose numbering both
  // keep in one IndexedDB store. (Not localStorage: a page's reads of it may miss another
  // page's latest writes, which no lock can mend.)
  const pages = [await browser.newPage(), await browser.newPage()];
  try {
    for (const [tab, page] of pages.entries()) {
      await page.goto(`${server.url}/`, { waitUntil: "load" });
      await page.waitForSelector("body[data-ready]", { timeout: 15_000 });
      await page.evaluate(async (tab) => {
        const { idempotentFetch } = await import("/idem/client-web.js");
        const db = await new Promise((resolve, reject) => {
          const open = indexedDB.open("tabs", 1);
          open.onupgradeneeded = () => open.result.createObjectStore("entries");
          open.onsuccess = () => resolve(open.result);
          open.onerror = () => reject(open.error);
        });
        const run = (mode, act) =>
          new Promise((resolve, reject) => {
            const tx = db.transaction("entries", mode);
            const request = act(tx.objectStore("entries"));
            tx.oncomplete = () => resolve(request.result);
            tx.onerror = () => reject(tx.error);
          });
        const persist = {
          load: async (id) => (await run("readonly", (s) => s.get(id))) ?? null,
          save: (id, bytes) => run("readwrite", (s) => s.put(bytes, id)),
          delete: (id) => run("readwrite", (s) => s.delete(id)),
        };
        const init = { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ item: "grinder", quantity: 1 }) };
        const counter = { client: "tabs-1", epoch: "9" };
        window.sendOrders = async (ids) => {
          const results = await Promise.all(ids.map((id) => idempotentFetch("/orders", init, { keyKind: "counter", counter, persist, id: `tab${tab}-${id}`, retry: { base: 5, cap: 20 } })));
          return results.map((r) => [r.outcome, r.key, r.response?.headers.get("idempotent-replayed") ?? null]);
        };
      }, tab);
    }
    const before = await count();
    // One order from each page in turn, so that both have read the numbering, then five from
    // each at the same time.
    const keys = [];
    for (const page of pages) keys.push(...(await page.evaluate(() => window.sendOrders(["first"]))));
    const rest = ["a", "b", "c", "d", "e"];
    keys.push(...(await Promise.all(pages.map((page) => page.evaluate((ids) => window.sendOrders(ids), rest)))).flat());
    for (const [outcome, , replayed] of keys) {
      assert.equal(outcome, "completed");
      assert.equal(replayed, null, `an order was answered with another's replay: ${JSON.stringify(keys)}`);
    }
    assert.equal(new Set(keys.map(([, key]) => key)).size, keys.length, keys.map(([, key]) => key).join(" "));
    assert.equal(await count(), before + keys.length, "every order ran");
  } finally {
    for (const page of pages) await page.close().catch(() => {});
  }
});
