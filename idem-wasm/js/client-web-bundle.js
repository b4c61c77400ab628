// The ESM bundle of the browsers' entry, dist/idem_client_web.js: the glue of the module
// without the counter numbering and the payload digest, the client's API, and the hook by
// which the entry says how to load the full module. The build bundles it in a stage of its
// own, where ./idem_client.js is that module's glue.
export { default, initSync } from "./idem_client.js";
export * from "./client.js";
export { fullModule } from "./outbox.js";
