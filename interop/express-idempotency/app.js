'use strict';
// Demo app for idem-conformance: express-idempotency 1.0.6 on Express 4, deployed as the
// library's README shows (default options: in-memory data adapter, `Idempotency-Key`
// header, 2xx-only response validator, url/method/query/body intent validator), with the
// README's `isHit(req)` check at the top of the route handler.
//
// Env: PORT (default 0: the OS chooses), DELAY_MS (default 100).
//
// Body "outcome": "decline" -> 402, "unavailable" -> 503, and (beyond the common brief, for
// lease/1's --crash-body) "crash" -> the first attempt under a given key fails with
// next(err), Express 4's way for a route to die (Express's final handler answers 500); a later
// attempt with that key, were one to reach the handler, succeeds as usual.
//
// The library has no way to scope keys by principal (no key prefix hook, no user
// extractor), so none is configured: one key is shared by every caller.

const express = require('express');
const { idempotency, getSharedIdempotencyService } = require('express-idempotency');

const PORT = Number(process.env.PORT || 0);
const DELAY_MS = Number(process.env.DELAY_MS || 100);

let executions = 0;
const crashedKeys = new Set();
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

const app = express();
// The default intent validator compares req.body, so the body must be parsed before the
// middleware runs.
app.use(express.json());

// Not behind the middleware: the side-effect oracle.
app.get('/count', (req, res) => {
    res.json({ count: executions });
});

app.post('/orders', idempotency(), async (req, res, next) => {
    // README: "To prevent transaction processing to occurs, there is a hit function which
    // determine if the idempotency middleware did process the request." The middleware calls
    // next() after it has sent a replay.
    if (getSharedIdempotencyService().isHit(req)) {
        return;
    }
    executions += 1;
    const n = executions;
    await sleep(DELAY_MS);
    const outcome = req.body && req.body.outcome;
    if (outcome === 'decline') {
        res.status(402).json({ error: 'card_declined', execution: n });
    } else if (outcome === 'unavailable') {
        res.status(503).json({ error: 'unavailable', execution: n });
    } else if (outcome === 'crash' && firstAttempt(req.get('Idempotency-Key'))) {
        next(new Error(`handler crashed (execution ${n})`));
    } else {
        res.status(201).location(`/orders/ord_${n}`).json({ id: `ord_${n}`, execution: n });
    }
});

// True the first time `key` is seen (always true without a key).
function firstAttempt(key) {
    if (key === undefined) return true;
    if (crashedKeys.has(key)) return false;
    crashedKeys.add(key);
    return true;
}

const server = app.listen(PORT, '127.0.0.1', () => {
    process.stdout.write(`listening on http://127.0.0.1:${server.address().port}\n`);
});

for (const signal of ['SIGTERM', 'SIGINT']) {
    process.on(signal, () => {
        server.close(() => process.exit(0));
        server.closeAllConnections();
    });
}
