// The order form. Each order has a logical id, made once; `idempotentFetch` sends it with one
// Idempotency-Key for every retry and saves its pending entry in localStorage before every
// send, so that after a reload (or a browser that was killed) the page resumes the order with
// the same key instead of placing it again. An answer that never came is reported as
// undetermined, never guessed.
//
// Retries: ?maxAttempts=N&base=MS&cap=MS&deadline=MS in the page's URL (defaults: 6 sends,
// 200 ms first backoff, 2 s at most, 60 s in all).
import { idempotentFetch } from "idem/client";

const ENTRY = "idem-entry:"; // idempotentFetch's saved entries, by order id
const ORDER = "order:"; // the page's orders: { body, state, key?, result? }
const CURRENT = "current-order";

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

const orders = {
  get: (id) => JSON.parse(localStorage.getItem(ORDER + id) ?? "null"),
  set: (id, order) => localStorage.setItem(ORDER + id, JSON.stringify(order)),
  pending: () =>
    Object.keys(localStorage)
      .filter((k) => k.startsWith(ORDER))
      .map((k) => k.slice(ORDER.length))
      .filter((id) => orders.get(id)?.state === "pending"),
};

const $ = (id) => document.getElementById(id);
const form = $("order");

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

/** Shows what became of order `id`. */
function show(id, outcome, title, detail, key) {
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

/** Sends order `id` with `body` (again, after a reload: the saved entry keeps its key) and
 * shows the outcome. `key` reuses the key of an order that already completed. */
async function place(id, body, key) {
  const before = orders.get(id);
  orders.set(id, { ...(before ?? {}), body, state: "pending" });
  show(id, "pending", "Placing the order…", "Waiting for the server. Reloading the page is safe: it resumes with the same key.");
  // A changed order under an id already sent: refused, and the order stays as it was.
  const refuseChanged = (detail, shownKey) => {
    orders.set(id, before?.state === "completed" ? before : { ...before, body, state: "refused" });
    show(id, "changed-payload", "Changed order refused", detail, shownKey);
  };
  let result;
  try {
    result = await idempotentFetch(
      "/orders",
      { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) },
      { id, persist, retry, key },
    );
  } catch (err) {
    if (err?.code !== "IDEM-CLIENT-1") throw err;
    refuseChanged("This order is still being sent with other contents; a changed order needs a new order id.");
    return;
  }
  if (result.outcome === "completed") {
    const created = await result.response.json();
    orders.set(id, { body, state: "completed", key: result.key, result: created });
    show(id, "completed", "Order placed", `${created.id}: ${created.quantity} × ${created.item} (${result.attempts} attempt${result.attempts === 1 ? "" : "s"})`, result.key);
  } else if (result.outcome === "rejected") {
    const problem = await result.response?.json().catch(() => null);
    if (problem?.type === "urn:idem:problem:key-reuse-mismatch") {
      // The server has this key with other contents: nothing new runs.
      refuseChanged(`The server already has this order with other contents (${result.status} ${problem.title ?? ""}). Nothing new was placed.`, result.key);
    } else {
      orders.set(id, { body, state: "rejected", key: result.key });
      show(id, "rejected", "Order refused", `${result.status} ${problem?.title ?? ""}`, result.key);
    }
  } else if (result.outcome === "undetermined") {
    orders.set(id, { body, state: "undetermined", key: result.key });
    show(id, "undetermined", "Outcome unknown", `No answer after ${result.attempts} attempts (${result.reason ?? "gave up"}): the order may or may not have been placed. Check your orders before placing it again.`, result.key);
  } else {
    orders.set(id, { body, state: "failed", key: result.key });
    show(id, "failed", "Order not placed", `The server could not be reached (${result.reason ?? "gave up"}); nothing was placed. Try again.`, result.key);
  }
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
  void place(id, formBody(), order?.state === "completed" ? order.key : undefined);
});

$("new").addEventListener("click", () => {
  localStorage.removeItem(CURRENT);
  showForm(null);
  $("outcome").hidden = true;
});

// After a reload: show the current order, and resume every order still pending.
const current = localStorage.getItem(CURRENT);
if (current !== null) {
  const order = orders.get(current);
  showForm(current, order);
  if (order?.state === "completed") {
    show(current, "completed", "Order placed", `${order.result.id}: ${order.result.quantity} × ${order.result.item}`, order.key);
  }
}
for (const id of orders.pending()) void place(id, orders.get(id).body);
document.body.dataset.ready = "true";
