// The client's API where the module at hand is the full one (every entry but the browsers'):
// the counter numbering and the payload digest run in it, and counter.js is bundled with it.
import { call } from "./client-module.js";
import { withSequence } from "./counter.js";
import { fullModule } from "./outbox.js";

fullModule(async () => ({ call, withSequence }));

export * from "./client.js";
