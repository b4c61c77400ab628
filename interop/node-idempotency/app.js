'use strict';
// Demo app for idem-conformance: @node-idempotency/nestjs 1.0.4 on NestJS 10 (Express
// platform), deployed as the package's README shows: NodeIdempotencyModule.forRootAsync with
// the memory storage adapter and default idempotency options, and @Idempotent() on the
// handler. Plain JavaScript: the decorators are applied with Reflect.decorate and
// parameter decorators are called directly, which is what TypeScript compiles them to.
//
// Env: PORT (default 0: the OS chooses), DELAY_MS (default 100), IDEMPOTENCY_TTL_MS (unset:
// the library's default cacheTTLMS, 24 h; set it to run the CLI's expiry cases).
//
// Body "outcome": "decline" -> 402, "unavailable" -> 503 (thrown as HttpException, Nest's
// usual way), and (beyond the common brief, for lease/1's --crash-body) "crash" -> the first
// attempt under a given key throws a plain Error (Nest answers 500); a later attempt with that
// key, were one to reach the handler, succeeds as usual.
//
// The library has no way to scope keys by principal: its options (idempotencyKey,
// keyMaxLength, cacheKeyPrefix, cacheTTLMS, enforceIdempotency, skipRequest) hold no
// per-request key derivation, so none is configured.

require('reflect-metadata');
const {
    Module,
    Controller,
    Get,
    Post,
    HttpCode,
    HttpException,
    Body,
    Headers,
    Res,
} = require('@nestjs/common');
const { NestFactory } = require('@nestjs/core');
const {
    NodeIdempotencyModule,
    Idempotent,
    StorageAdapterEnum,
} = require('@node-idempotency/nestjs');

const PORT = Number(process.env.PORT || 0);
const DELAY_MS = Number(process.env.DELAY_MS || 100);

let executions = 0;
const crashedKeys = new Set();

// True the first time `key` is seen (always true without a key).
function firstAttempt(key) {
    if (key === undefined) return true;
    if (crashedKeys.has(key)) return false;
    crashedKeys.add(key);
    return true;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

class OrdersController {
    // Not behind the interceptor: the side-effect oracle.
    count() {
        return { count: executions };
    }

    async create(body, key, res) {
        executions += 1;
        const n = executions;
        await sleep(DELAY_MS);
        const outcome = body && body.outcome;
        if (outcome === 'decline') {
            throw new HttpException({ error: 'card_declined', execution: n }, 402);
        }
        if (outcome === 'unavailable') {
            throw new HttpException({ error: 'unavailable', execution: n }, 503);
        }
        if (outcome === 'crash' && firstAttempt(key)) {
            throw new Error(`handler crashed (execution ${n})`);
        }
        res.setHeader('Location', `/orders/ord_${n}`);
        return { id: `ord_${n}`, execution: n };
    }
}

// @Controller() on the class; @Get('count') on count(); @Post('orders') @HttpCode(201)
// @Idempotent() on create(@Body() body, @Headers('idempotency-key') key,
// @Res({ passthrough: true }) res).
Controller()(OrdersController);
const proto = OrdersController.prototype;
const decorate = (decorators, name) =>
    Object.defineProperty(
        proto,
        name,
        Reflect.decorate(decorators, proto, name, Object.getOwnPropertyDescriptor(proto, name)),
    );
decorate([Get('count')], 'count');
Body()(proto, 'create', 0);
Headers('idempotency-key')(proto, 'create', 1);
Res({ passthrough: true })(proto, 'create', 2);
decorate([Post('orders'), HttpCode(201), Idempotent()], 'create');

const idempotencyOptions = {};
if (process.env.IDEMPOTENCY_TTL_MS) {
    idempotencyOptions.cacheTTLMS = Number(process.env.IDEMPOTENCY_TTL_MS);
}

class AppModule {}
Module({
    imports: [
        NodeIdempotencyModule.forRootAsync({
            storage: { adapter: StorageAdapterEnum.memory },
            ...idempotencyOptions,
        }),
    ],
    controllers: [OrdersController],
})(AppModule);

async function main() {
    const app = await NestFactory.create(AppModule, { logger: ['error', 'warn'] });
    await app.listen(PORT, '127.0.0.1');
    const { port } = app.getHttpServer().address();
    process.stdout.write(`listening on http://127.0.0.1:${port}\n`);
    for (const signal of ['SIGTERM', 'SIGINT']) {
        process.once(signal, () => {
            app.getHttpServer().closeAllConnections();
            app.close().then(() => process.exit(0));
        });
    }
}

main().catch((err) => {
    console.error(err);
    process.exit(1);
});
