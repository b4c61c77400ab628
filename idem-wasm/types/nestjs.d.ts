// Types of `idem/nestjs`.
import type { CallHandler, DynamicModule, ExecutionContext, NestInterceptor } from "@nestjs/common";
import type { Reflector } from "@nestjs/core";
import type { Observable } from "rxjs";
import type { IdempotencyContext, IdempotencyOptions } from "idem";

/** The options of `IdempotencyModule.forRoot`: `withIdempotency`'s, with `principal` given
 * the platform's request (Express's or Fastify's) after the guards. */
export type NestIdempotencyOptions<Req = any> = Omit<IdempotencyOptions, "principal" | "route"> & {
  /** The caller's stable id. Default: the id of `req.user` as authentication guards set it
   * (the user itself when it is a string or number, else `user.id`, else `user.sub`); an
   * empty one is refused (IDEM-SCOPE-3). `"none"` for an API with a single tenant. */
  principal?: ((req: Req) => string | number | Promise<string | number>) | "none";
};

/** The provider token of the module's `Idempotency` (`@Inject(IDEMPOTENCY)`), for a
 * service that issues tokens or opens counter sessions with it. */
export declare const IDEMPOTENCY: unique symbol;

/** Marks a handler, or every handler of a controller, as guarded by idempotency keys. A
 * `GET` with `Idempotency-Status` routed to a marked handler is a status query, answered
 * from the store after the guards (unless `statusQueries: false`). */
export declare function Idempotent(): MethodDecorator & ClassDecorator;

/** The module: global, with the body intake on the platform and the interceptor. Create the
 * application with `NestFactory.create`. */
export declare class IdempotencyModule {
  static forRoot<Req = any>(options: NestIdempotencyOptions<Req>): DynamicModule;
}

/** The interceptor `IdempotencyModule.forRoot` registers globally: it guards the handlers
 * marked `@Idempotent()`, answers the status queries routed to them, and lets every other
 * request through. */
export declare class IdempotencyInterceptor implements NestInterceptor {
  constructor(reflector: Reflector, binding: unknown);
  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown>;
}

/** What a guarded request carries once it runs (on either platform's request). */
export interface IdempotentRequest {
  /** The raw body, read for the fingerprint. */
  rawBody?: Buffer;
  /** The idempotency context of the execution (the request that runs). */
  idempotency?: IdempotencyContext;
}
