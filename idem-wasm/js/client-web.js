// Browsers and bundlers, `idem/client`, bundled into one file with the client's API: the
// module without the counter numbering and the payload digest (idem_client_lean_bg.wasm) is
// fetched next to this file (a bundler rewrites the URL) and instantiated with top-level
// await. The full module (idem_client_bg.wasm, with its own loader and the counter numbering,
// idem_client_loader.js) is fetched only when a page needs it: for counter keys, or without
// WebCrypto (a page that is not a secure context).
import { initSync, moduleBytes } from "./client-module.js";
import { fullModule } from "./outbox.js";

initSync(await WebAssembly.compile(await moduleBytes(fetch(new URL("./idem_client_lean_bg.wasm", import.meta.url)))));
fullModule(async () => {
  const loader = await import("./idem_client_loader.js");
  await loader.default({ module_or_path: new URL("./idem_client_bg.wasm", import.meta.url) });
  return loader;
});

export { initSync } from "./client-module.js";
export { idempotentFetch, reconcile } from "./client.js";
