// Types of `idem/opentelemetry`.
import type { TelemetryHook } from "idem";

/** The structural parts of `@opentelemetry/api`'s Tracer and Meter that the hook uses. */
interface Tracer {
  startSpan(name: string, options?: { attributes?: Record<string, string | number> }): {
    setAttribute(key: string, value: string | number): unknown;
    end(): void;
  };
}
interface Meter {
  createCounter(name: string, options?: { unit?: string }): { add(value: number, attributes?: Record<string, string>): void };
  createHistogram(name: string, options?: { unit?: string }): { record(value: number, attributes?: Record<string, string>): void };
}

/** A telemetry hook (`options.telemetry`) that records idem's spans with `tracer` and its
 * metrics with `meter` (default: `trace.getTracer(name, version)` and
 * `metrics.getMeter(name, version)` of `@opentelemetry/api`, `name` "idem"). */
export function openTelemetry(options?: { tracer?: Tracer; meter?: Meter; name?: string; version?: string }): TelemetryHook;
