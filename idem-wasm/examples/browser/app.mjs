// The order page. Each order has a logical id, made once; `idempotentFetch` sends it with one
// Idempotency-Key for every retry and saves its pending entry in localStorage before every
// send, so that after a reload (or a browser that was killed) the page resumes the order with
// the same key instead of placing it again. A resumed order is asked about first: the server
// says whether it ran (its answer is fetched with the same key), or settles a key it never
// saw so that a late copy can never run. When the server cannot be reached, the order is
// shown as unknown, never guessed, and asked about again on the next load.
//
// Retries: ?maxAttempts=N&base=MS&cap=MS&deadline=MS in the page's URL (defaults: 6 sends,
// 200 ms first backoff, 2 s at most, 60 s in all).
import { idempotentFetch } from "idem/client";

const ENTRY = "idem-entry:"; // idempotentFetch's saved entries, by order id
const ORDER = "order:"; // the page's orders: { body, state, created, key?, ... } (below)
const CURRENT = "current-order"; // the order in the form

const params = new URL(location.href).searchParams;
const number = (name, fallback) => (params.has(name) ? Number(params.get(name)) : fallback);
const retry = {
  maxAttempts: number("maxAttempts", 6),
  base: number("base", 200),
  cap: number("cap", 2000),
  deadline: number("deadline", 60_000),
};

const base64 = (bytes) => btoa(String.fromCharCode(...bytes));
const unbase64 = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));

/** Where idempotentFetch keeps an order's pending entry (its key, attempts, backoff). */
const persist = {
  load: (id) => {
    const saved = localStorage.getItem(ENTRY + id);
    return saved === null ? null : unbase64(saved);
  },
  save: (id, bytes) => localStorage.setItem(ENTRY + id, base64(bytes)),
  delete: (id) => localStorage.removeItem(ENTRY + id),
};

/**
 * What the page knows of an order, by `state`: `placing` (sent, no answer yet), `placed`
 * (`result`: the server's order, `attempts`), `executed` (it ran, its answer is gone;
 * `status` when known), `not-placed` (the server never got it and never will run it; `again`:
 * the order id it was placed again under), `unknown` (the server could not be asked or could
 * not tell, `reason`: asked again on the next load), `refused` (`status`, `title`) and
 * `failed` (nothing was placed, `reason`).
 */
const orders = {
  get: (id) => JSON.parse(localStorage.getItem(ORDER + id) ?? "null"),
  set: (id, order) => {
    localStorage.setItem(ORDER + id, JSON.stringify(order));
    render();
  },
  all: () =>
    Object.keys(localStorage)
      .filter((k) => k.startsWith(ORDER))
      .map((k) => ({ id: k.slice(ORDER.length), ...orders.get(k.slice(ORDER.length)) }))
      .sort((a, b) => (a.created ?? 0) - (b.created ?? 0)),
  /** Orders whose fate the page does not know yet: resumed on load. */
  open: () => orders.all().filter((o) => o.state === "placing" || o.state === "unknown"),
};

const LABELS = {
  placing: "placing…",
  placed: "placed",
  executed: "ran, answer gone",
  "not-placed": "not placed",
  unknown: "unknown",
  refused: "refused",
  failed: "failed",
};

const $ = (id) => document.getElementById(id);
const form = $("order");
const plural = (n) => `${n} attempt${n === 1 ? "" : "s"}`;

function formBody() {
  return { item: $("item").value, quantity: Number($("quantity").value) };
}

function showForm(id, order) {
  $("order-id").textContent = id ?? "(new)";
  $("resubmit").disabled = id === null;
  if (order) {
    $("item").value = order.body.item;
    $("quantity").value = String(order.body.quantity);
  }
}

/** The outcome box's words for a stored order: [outcome, title, detail]. */
function describe(order) {
  switch (order.state) {
    case "placing":
      return ["pending", "Placing the order…", "Waiting for the server. Reloading the page is safe: it resumes with the same key."];
    case "placed": {
      const r = order.result;
      return ["completed", "Order placed", `${r.id}: ${r.quantity} × ${r.item}${order.attempts ? ` (${plural(order.attempts)})` : ""}`];
    }
    case "executed":
      return ["executed", "Order placed, answer gone", `The server ran this order${order.status ? ` (${order.status})` : ""} but no longer keeps its answer.`];
    case "not-placed":
      return ["not-executed", "Order not placed", "The server never got this order, and it will never run it. Place it again: it goes out as a new order."];
    case "unknown":
      return order.reason === "interrupted"
        ? ["undetermined", "Outcome unknown", "The server could not be reached to ask about this order: it may or may not have been placed. The page asks again when it next loads."]
        : ["undetermined", "Outcome unknown", `No answer after ${plural(order.attempts)} (${order.reason ?? "gave up"}): the order may or may not have been placed. The page asks the server again when it next loads.`];
    case "refused":
      return ["rejected", "Order refused", `${order.status} ${order.title ?? ""}`];
    default:
      return ["failed", "Order not placed", `The server could not be reached (${order.reason ?? "gave up"}); nothing was placed. Place it again.`];
  }
}

/** Shows what became of order `id` in the outcome box, when it is the order in the form. */
function show(id, outcome, title, detail, key) {
  if (id !== localStorage.getItem(CURRENT)) return;
  const box = $("outcome");
  box.hidden = false;
  box.dataset.outcome = outcome;
  box.dataset.order = id;
  box.dataset.key = key ?? "";
  box.replaceChildren();
  const h = document.createElement("h2");
  h.textContent = title;
  const p = document.createElement("p");
  p.textContent = detail;
  const small = document.createElement("p");
  small.className = "muted";
  small.textContent = `order ${id}${key ? ` · Idempotency-Key ${key}` : ""}`;
  box.append(h, p, small);
}

const showStored = (id) => show(id, ...describe(orders.get(id)), orders.get(id).key);

/** The list of every order the page knows, each `li[data-order][data-state][data-key]`. */
function render() {
  const items = orders.all().map((order) => {
    const li = document.createElement("li");
    li.dataset.order = order.id;
    li.dataset.state = order.state;
    li.dataset.key = order.key ?? "";
    const state = document.createElement("span");
    state.className = "state";
    state.textContent = LABELS[order.state] ?? order.state;
    const what = document.createElement("span");
    what.textContent = ` ${order.body.quantity} × ${order.body.item}`;
    const detail = document.createElement("span");
    detail.className = "muted";
    detail.textContent = order.state === "placed" ? ` ${order.result.id} · order ${order.id}` : ` order ${order.id}`;
    li.title = describe(order)[2];
    li.append(state, what, detail);
    if ((order.state === "not-placed" || order.state === "failed") && !order.again) {
      const again = document.createElement("button");
      again.type = "button";
      again.className = "secondary again";
      again.textContent = "Place again";
      again.addEventListener("click", () => placeAgain(order.id));
      li.append(" ", again);
    } else if (order.again) {
      detail.textContent += ` · placed again as ${order.again}`;
    }
    return li;
  });
  $("orders").replaceChildren(...items);
  $("orders-empty").hidden = items.length > 0;
}

/** Sends order `id` with `body` (again, after a reload: the saved entry keeps its key and is
 * asked about first) and records what became of it. `key` reuses the key of a placed order. */
async function place(id, body, key) {
  const before = orders.get(id);
  orders.set(id, { created: Date.now(), ...before, body, state: "placing" });
  showStored(id);
  let result;
  try {
    result = await idempotentFetch(
      "/orders",
      { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) },
      { id, persist, retry, key },
    );
  } catch (err) {
    if (err?.code !== "IDEM-CLIENT-1") throw err;
    // Another payload under an id still being sent: refused before anything went out, and
    // the order stays as it was.
    if (before) orders.set(id, before);
    show(id, "changed-payload", "Changed order refused", "This order is still being sent with other contents; a changed order needs a new order id.");
    return;
  }
  const { outcome, key: sentKey, attempts } = result;
  const order = { created: orders.get(id).created, body, key: sentKey, attempts };
  if (outcome === "completed") {
    orders.set(id, { ...order, state: "placed", result: await result.response.json() });
  } else if (outcome === "rejected") {
    const problem = await result.response?.json().catch(() => null);
    if (problem?.type === "urn:idem:problem:key-reuse-mismatch") {
      // The server has this key with other contents: nothing new runs, and a placed order
      // stays placed.
      orders.set(id, before?.state === "placed" ? before : { ...order, state: "refused", status: result.status, title: problem.title });
      show(id, "changed-payload", "Changed order refused", `The server already has this order with other contents (${result.status} ${problem.title ?? ""}). Nothing new was placed.`, sentKey);
      return;
    }
    orders.set(id, { ...order, state: "refused", status: result.status, title: problem?.title });
  } else if (outcome === "executed") {
    orders.set(id, { ...order, state: "executed", status: result.status });
  } else if (outcome === "not-executed") {
    orders.set(id, { ...order, state: "not-placed" });
  } else if (outcome === "undetermined") {
    orders.set(id, { ...order, state: "unknown", reason: result.reason });
  } else {
    orders.set(id, { ...order, state: "failed", reason: result.reason });
  }
  showStored(id);
}

/** Places order `id`'s contents again as a new order, with an id (and a key) of its own. */
function placeAgain(id) {
  const old = orders.get(id);
  const fresh = crypto.randomUUID();
  orders.set(id, { ...old, again: fresh });
  localStorage.setItem(CURRENT, fresh);
  showForm(fresh, old);
  void place(fresh, old.body);
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  const id = crypto.randomUUID();
  localStorage.setItem(CURRENT, id);
  showForm(id);
  void place(id, formBody());
});

$("resubmit").addEventListener("click", () => {
  const id = localStorage.getItem(CURRENT);
  if (id === null) return;
  const order = orders.get(id);
  void place(id, formBody(), order?.state === "placed" ? order.key : undefined);
});

$("new").addEventListener("click", () => {
  localStorage.removeItem(CURRENT);
  showForm(null);
  $("outcome").hidden = true;
});

// On load: list every order, show the one in the form, and resume every order whose fate is
// open (each is asked about first).
render();
const current = localStorage.getItem(CURRENT);
if (current !== null) {
  const order = orders.get(current);
  showForm(current, order);
  if (order) showStored(current);
}
for (const { id, body } of orders.open()) void place(id, body);
document.body.dataset.ready = "true";
