//! The layer's telemetry through tracing-opentelemetry, as `docs/observability.md` sets it
//! up, into OpenTelemetry's in-memory exporters: one span per operation with the record's
//! digest, its decision and its outcome; the metrics under idem-core's names; and never the
//! key or the principal in clear (IDEM-EVT-2).
//!
//! Run with `cargo test -p idem-tower --features opentelemetry-tests --test opentelemetry`.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use idem_core::telemetry::{attr, metric, span};
use idem_core::{Config, Engine, Inbox, Message, Policy, Problem, RecordKey, Scope};
use idem_tower::{deliver, IdempotencyLayer, MemoryStore};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};
use tracing_subscriber::layer::SubscriberExt;

type Body = Either<Full<Bytes>, Full<Bytes>>;

const PRINCIPAL: &str = "acct-principal-7f3a";

/// The subscriber of `docs/observability.md`, with in-memory exporters.
struct Otel {
    spans: InMemorySpanExporter,
    tracer: SdkTracerProvider,
    metrics: InMemoryMetricExporter,
    meter: SdkMeterProvider,
}

fn install() -> Otel {
    let spans = InMemorySpanExporter::default();
    let tracer = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let metrics = InMemoryMetricExporter::default();
    let meter = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(metrics.clone()).build())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(tracer.tracer("idem-tower")))
        .with(tracing_opentelemetry::MetricsLayer::new(meter.clone()));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    Otel {
        spans,
        tracer,
        metrics,
        meter,
    }
}

impl Otel {
    /// The spans ended since the last call.
    fn take_spans(&self) -> Vec<SpanData> {
        self.tracer.force_flush().unwrap();
        let spans = self.spans.get_finished_spans().unwrap();
        self.spans.reset();
        spans
    }

    /// The metric `name`'s points (cumulative): their value (a sum's, a histogram's count)
    /// and attributes.
    fn points(&self, name: &str) -> Vec<(f64, Vec<KeyValue>)> {
        self.meter.force_flush().unwrap();
        let exported = self.metrics.get_finished_metrics().unwrap();
        // Cumulative: the last export holds everything so far.
        let Some(last) = exported.last() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for scope in last.scope_metrics() {
            for m in scope.metrics().filter(|m| m.name() == name) {
                match m.data() {
                    AggregatedMetrics::U64(MetricData::Sum(sum)) => out.extend(
                        sum.data_points()
                            .map(|p| (p.value() as f64, p.attributes().cloned().collect())),
                    ),
                    AggregatedMetrics::F64(MetricData::Histogram(h)) => out.extend(
                        h.data_points()
                            .map(|p| (p.count() as f64, p.attributes().cloned().collect())),
                    ),
                    other => panic!("{name}: unexpected data {other:?}"),
                }
            }
        }
        out
    }

    /// The sum of metric `name`'s points whose attribute `key` is `value` (any point when
    /// `key` is empty).
    fn total(&self, name: &str, key: &str, value: &str) -> f64 {
        self.points(name)
            .iter()
            .filter(|(_, attrs)| key.is_empty() || attr_of(attrs, key).as_deref() == Some(value))
            .map(|(v, _)| v)
            .sum()
    }
}

fn attr_of(attrs: &[KeyValue], key: &str) -> Option<String> {
    attrs
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

/// The one span named `name` among `spans`.
fn one<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
    let found: Vec<&SpanData> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "spans named {name}: {spans:#?}");
    found[0]
}

fn get(span: &SpanData, key: &str) -> String {
    attr_of(&span.attributes, key).unwrap_or_else(|| panic!("{key} missing: {span:#?}"))
}

fn post(key: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::post("/orders")
        .header("idempotency-key", format!("\"{key}\""))
        .header("x-account", PRINCIPAL)
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

async fn status_of<S>(service: S, request: Request<Full<Bytes>>) -> u16
where
    S: Service<
        Request<Full<Bytes>>,
        Response = Response<idem_tower::OuterBody<Full<Bytes>>>,
        Error = Infallible,
    >,
{
    let r = service
        .oneshot(request)
        .await
        .unwrap_or_else(|e| match e {});
    let status = r.status().as_u16();
    let _ = r.into_body().collect().await;
    status
}

/// A handler that stalls `stall` ms and answers 201.
fn orders(
    layer: &IdempotencyLayer<Arc<MemoryStore>>,
    stall: u64,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<idem_tower::OuterBody<Full<Bytes>>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    layer.layer(tower::service_fn(move |_: Request<Body>| async move {
        tokio::time::sleep(Duration::from_millis(stall)).await;
        let mut r = Response::new(Full::new(Bytes::from_static(b"created")));
        *r.status_mut() = StatusCode::CREATED;
        Ok::<_, Infallible>(r)
    }))
}

/// Every attribute value of every span and span event, as text.
fn every_value(spans: &[SpanData]) -> Vec<String> {
    let mut out = Vec::new();
    for s in spans {
        out.extend(s.attributes.iter().map(|kv| kv.value.to_string()));
        for e in s.events.iter() {
            out.push(e.name.to_string());
            out.extend(e.attributes.iter().map(|kv| kv.value.to_string()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_layer_emits_one_span_per_operation_and_the_metrics_never_the_key() {
    // IDEM-EVT-2
    let otel = install();
    let store = Arc::new(MemoryStore::default());
    // The host names its routes: the route is the spans' http.route.
    let layer = IdempotencyLayer::builder(Arc::clone(&store))
        .route(|_| "/orders".to_owned())
        .principal(|parts| {
            parts
                .headers
                .get("x-account")?
                .to_str()
                .ok()
                .map(str::to_owned)
        })
        .build()
        .unwrap();
    let key = "order-key-3c9d1e";

    // A fresh request: one span, executed, with the digest and the HTTP attributes.
    assert_eq!(status_of(orders(&layer, 0), post(key, "{}")).await, 201);
    let spans = otel.take_spans();
    let fresh = one(&spans, span::REQUEST);
    println!(
        "exported span: {} {:?}",
        fresh.name,
        fresh
            .attributes
            .iter()
            .map(|kv| format!("{}={}", kv.key, kv.value))
            .collect::<Vec<_>>()
    );
    assert_eq!(get(fresh, attr::OUTCOME), "executed");
    assert_eq!(get(fresh, attr::DECISION), "executed");
    assert_eq!(get(fresh, attr::OPERATION), "request");
    assert_eq!(get(fresh, attr::HTTP_REQUEST_METHOD), "POST");
    assert_eq!(get(fresh, attr::HTTP_ROUTE), "/orders");
    assert_eq!(
        attr_of(&fresh.attributes, attr::HTTP_RESPONSE_STATUS_CODE),
        Some("201".into())
    );
    assert_eq!(
        fresh
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == attr::HTTP_RESPONSE_STATUS_CODE)
            .map(|kv| kv.value.clone()),
        Some(Value::I64(201)),
        "the status is an integer"
    );
    assert_eq!(attr_of(&fresh.attributes, attr::ERROR_TYPE), None);
    let digest = get(fresh, attr::KEY_DIGEST);
    assert_eq!(digest.len(), 32);
    assert!(digest.bytes().all(|b| b.is_ascii_hexdigit()));
    let mut seen = spans;

    // The retry: replayed, the same digest.
    assert_eq!(status_of(orders(&layer, 0), post(key, "{}")).await, 201);
    let spans = otel.take_spans();
    let replay = one(&spans, span::REQUEST);
    assert_eq!(get(replay, attr::OUTCOME), "replayed");
    assert_eq!(get(replay, attr::KEY_DIGEST), digest, "one key, one digest");
    seen.extend(spans);

    // The same key with another payload: a mismatch, its problem as error.type.
    assert_eq!(
        status_of(orders(&layer, 0), post(key, r#"{"n":2}"#)).await,
        422
    );
    let spans = otel.take_spans();
    let mismatch = one(&spans, span::REQUEST);
    assert_eq!(get(mismatch, attr::OUTCOME), "mismatch");
    assert_eq!(get(mismatch, attr::ERROR_TYPE), Problem::MISMATCH.slug);
    seen.extend(spans);

    // A duplicate racing a request in flight: a conflict.
    let first = tokio::spawn(status_of(orders(&layer, 400), post("race-key-88", "{}")));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        status_of(orders(&layer, 0), post("race-key-88", "{}")).await,
        409
    );
    assert_eq!(first.await.unwrap(), 201);
    let spans = otel.take_spans();
    let outcomes: Vec<String> = spans
        .iter()
        .filter(|s| s.name == span::REQUEST)
        .map(|s| get(s, attr::OUTCOME))
        .collect();
    assert_eq!(outcomes.len(), 2, "{spans:#?}");
    let conflict = spans
        .iter()
        .find(|s| attr_of(&s.attributes, attr::OUTCOME).as_deref() == Some("conflict"))
        .unwrap();
    assert_eq!(get(conflict, attr::ERROR_TYPE), Problem::IN_PROGRESS.slug);
    assert!(outcomes.contains(&"conflict".to_owned()), "{outcomes:?}");
    assert!(outcomes.contains(&"executed".to_owned()), "{outcomes:?}");
    seen.extend(spans);

    // A status query: its own span, in the same scope, so with the same digest.
    let query = Request::get("/orders")
        .header("idempotency-key", format!("\"{key}\""))
        .header("idempotency-status", "POST")
        .header("x-account", PRINCIPAL)
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(status_of(orders(&layer, 0), query).await, 200);
    let spans = otel.take_spans();
    let status = one(&spans, span::STATUS);
    assert_eq!(get(status, attr::OUTCOME), "executed");
    assert_eq!(get(status, attr::KEY_DIGEST), digest);
    seen.extend(spans);

    // A lease taken over: a handler that panicked, retried after its lease ended.
    let engine = Engine::new(Config {
        lease: Duration::from_millis(200),
        ..Config::default()
    })
    .unwrap();
    let short = IdempotencyLayer::builder(Arc::new(MemoryStore::default()))
        .policy(Policy::new(engine))
        .single_tenant()
        .build()
        .unwrap();
    let panicking = short.layer(tower::service_fn(|_: Request<Body>| async {
        if true {
            panic!("the handler failed");
        }
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    }));
    let crashed = tokio::spawn(panicking.oneshot(post("crash-key-5", "{}"))).await;
    assert!(crashed.is_err_and(|e| e.is_panic()));
    let takeovers = otel.total(metric::LEASE_TAKEOVERS, "", "");
    tokio::time::sleep(Duration::from_millis(250)).await;
    let short_orders = short.layer(tower::service_fn(|_: Request<Body>| async {
        let mut r = Response::new(Full::new(Bytes::from_static(b"created")));
        *r.status_mut() = StatusCode::CREATED;
        Ok::<_, Infallible>(r)
    }));
    assert_eq!(
        status_of(short_orders, post("crash-key-5", "{}")).await,
        201
    );
    assert_eq!(otel.total(metric::LEASE_TAKEOVERS, "", ""), takeovers + 1.0);
    let spans = otel.take_spans();
    let recovered = spans
        .iter()
        .find(|s| attr_of(&s.attributes, attr::OUTCOME).as_deref() == Some("recovered"))
        .unwrap_or_else(|| panic!("no recovered span: {spans:#?}"));
    assert_eq!(get(recovered, attr::DECISION), "took-over");
    // No route function: a raw path may carry ids, so it is no span's http.route.
    assert_eq!(attr_of(&recovered.attributes, attr::HTTP_ROUTE), None);
    // Single tenant: the scope is method and route, and the digest is idem-core's.
    let record = RecordKey::new(Scope::new("", "POST", "/orders"), "crash-key-5");
    assert_eq!(get(recovered, attr::KEY_DIGEST), record.digest());
    seen.extend(spans);

    // Inbox deliveries: a span each, the redelivery replayed.
    let inbox = Inbox::new(Engine::new(Config::default()).unwrap());
    let message = Message {
        source: "payments",
        id: "evt-secret-31",
        content_type: None,
        body: b"{}",
    };
    for _ in 0..2 {
        let delivered = deliver(&*store, &inbox, &message, |_| async { Ok::<(), ()>(()) })
            .await
            .unwrap();
        assert_eq!(delivered.receipt.status(), 200);
    }
    let spans = otel.take_spans();
    let deliveries: Vec<(String, String)> = spans
        .iter()
        .filter(|s| s.name == span::INBOX_DELIVERY)
        .map(|s| (get(s, attr::OUTCOME), get(s, attr::OPERATION)))
        .collect();
    assert_eq!(
        deliveries,
        [
            ("executed".to_owned(), "inbox.delivery".to_owned()),
            ("replayed".to_owned(), "inbox.delivery".to_owned())
        ]
    );
    seen.extend(spans);

    // The metrics: requests by outcome, store latency by call, records written.
    for (outcome, n) in [
        ("executed", 4.0),
        ("replayed", 2.0),
        ("mismatch", 1.0),
        ("conflict", 1.0),
        ("recovered", 1.0),
    ] {
        assert_eq!(
            otel.total(metric::REQUESTS, attr::OUTCOME, outcome),
            n,
            "{outcome}: {:?}",
            otel.points(metric::REQUESTS)
        );
    }
    assert!(otel.total(metric::STORE_DURATION, attr::STORE_OPERATION, "load") >= 7.0);
    assert!(otel.total(metric::STORE_DURATION, attr::STORE_OPERATION, "apply") >= 4.0);
    // A claim and a completion for each of the three requests that ran (the fresh one, the
    // first of the race, the recovery) and the first delivery, and the crashed attempt's
    // claim.
    assert!(
        otel.total(metric::RECORDS_WRITTEN, "", "") >= 9.0,
        "{:?} {:?}",
        otel.points(metric::RECORDS_WRITTEN),
        otel.points(metric::STORE_DURATION)
    );

    // Nowhere the key or the principal in clear.
    let values = every_value(&seen);
    for secret in [
        key,
        "race-key-88",
        "crash-key-5",
        "evt-secret-31",
        PRINCIPAL,
    ] {
        assert!(
            !values.iter().any(|v| v.contains(secret)),
            "{secret} in {values:?}"
        );
    }
}
