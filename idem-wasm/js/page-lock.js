// The Web Locks of an origin (browsers, in secure contexts): the pages and workers of an
// origin share its storage, so a `persist` over IndexedDB holds one record for all of them.
// A change to such a record that reads it first runs under the record's lock, so that no
// two pages change it at once (IDEM-CLIENT-9). A `persist` over `localStorage` cannot be
// shared so: a page's read of it may miss another page's last write, lock or not.
const locks = globalThis.navigator?.locks;

/** Whether other pages may share this page's `persist`: there are locks to take turns. */
export const pagesShare = locks !== undefined;

/** Runs `fn` under this origin's lock `name` when pages may share `persist`, otherwise at
 * once; resolves to what it resolves to. */
export function underPageLock(persist, name, fn) {
  return persist && pagesShare ? locks.request(name, fn) : fn();
}
