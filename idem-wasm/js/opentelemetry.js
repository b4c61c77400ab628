// `idem/opentelemetry`: the telemetry hook of `Idempotency` and `withIdempotency`
// (`options.telemetry`) on `@opentelemetry/api`, an optional peer dependency that only this
// entry imports: `idem` itself never loads it. The spans, attributes and metrics are
// idem-core's (the module names them; see docs/observability.md): this only hands them to the
// API's tracer and meter.
import { context, metrics, trace } from "@opentelemetry/api";

/**
 * A telemetry hook that records idem's spans with `tracer` and its metrics with `meter`
 * (by default `trace.getTracer(name)` and `metrics.getMeter(name)` of the global
 * providers, with `name` "idem"). The handler runs in the operation's span, so that its own
 * spans are children of it.
 */
export function openTelemetry({ tracer, meter, name = "idem", version } = {}) {
  const t = tracer ?? trace.getTracer(name, version);
  const m = meter ?? metrics.getMeter(name, version);
  const counters = new Map();
  const histograms = new Map();
  return {
    startSpan(spanName, attributes) {
      return t.startSpan(spanName, { attributes });
    },
    inSpan(span, fn) {
      return context.with(trace.setSpan(context.active(), span), fn);
    },
    count(metric, n, attributes) {
      let counter = counters.get(metric);
      if (counter === undefined) counters.set(metric, (counter = m.createCounter(metric)));
      counter.add(n, attributes);
    },
    record(metric, value, attributes, unit) {
      let histogram = histograms.get(metric);
      if (histogram === undefined) histograms.set(metric, (histogram = m.createHistogram(metric, { unit })));
      histogram.record(value, attributes);
    },
  };
}
