// The full client module's loader for a browser page (dist/idem_client_loader.js): the page
// imports it, with the counter numbering that runs in that module, only when it sends counter
// keys or has no WebCrypto (js/client-web.js). Its own bundle, with its own instance.
export { default, call } from "./client-module.js";
export { withSequence } from "./counter.js";
