// The ESM bundle of the browsers' entry, dist/idem_client_web.js: the loader of the module
// without the counter numbering and the payload digest, the client's API, and the hook by
// which the entry says how to load the full module.
export { default, initSync } from "./client-module.js";
export * from "./client.js";
export { fullModule } from "./outbox.js";
