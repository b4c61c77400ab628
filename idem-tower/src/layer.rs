//! The layer: [`IdempotencyLayer`], a small `Clone` handle on its settings, made by a
//! [`Builder`] that refuses a layer without a principal ([`BuildError`]).

use crate::drive::Shared;
use crate::service::Idempotent;
use http::request::Parts;
use idem_core::{Engine, Event, Policy, RecordKey};
use std::fmt;
use std::sync::Arc;
use tower_layer::Layer;

pub(crate) type PrincipalFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;
pub(crate) type RouteFn = dyn Fn(&Parts) -> String + Send + Sync;
pub(crate) type FilterFn = dyn Fn(&Parts) -> bool + Send + Sync;
pub(crate) type EventFn = dyn Fn(&Event, &RecordKey) + Send + Sync;

/// Who sent a request.
#[derive(Clone)]
pub(crate) enum Principal {
    /// One tenant, said so explicitly.
    Single,
    /// The host's extractor; `None` from it is an empty principal, refused (`IDEM-SCOPE-3`).
    Extract(Arc<PrincipalFn>),
}

/// Why [`Builder::build`] refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BuildError {
    /// No principal extractor and no [`Builder::single_tenant`]: there is no silent default
    /// (a credential that rotates would split one user into two scopes; a missing one would
    /// put every caller in one).
    NoPrincipal,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NoPrincipal => f.write_str(
                "IDEM-SCOPE-3: say who sends each request with .principal(|parts| …) (an account or user id, never a bearer token that rotates), or .single_tenant()",
            ),
        }
    }
}

impl std::error::Error for BuildError {}

/// Builds an [`IdempotencyLayer`].
pub struct Builder<St> {
    store: St,
    policy: Policy,
    principal: Option<Principal>,
    route: Option<Arc<RouteFn>>,
    filter: Option<Arc<FilterFn>>,
    on_event: Option<Arc<EventFn>>,
    status_queries: bool,
}

impl<St> Builder<St> {
    /// The policy: the engine's times (`response_ttl`, `key_ttl`, lease), key kind, methods,
    /// fingerprint, in-flight policy and response size limit. The default is idem-core's.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Who sent a request: an account or user id, never a credential that rotates. `None`
    /// is an empty principal, which is refused (`IDEM-SCOPE-3`).
    pub fn principal<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.principal = Some(Principal::Extract(Arc::new(f)));
        self
    }

    /// The service has one tenant: keys are not scoped by caller.
    pub fn single_tenant(mut self) -> Self {
        self.principal = Some(Principal::Single);
        self
    }

    /// The route of a request, for its scope (default: its path). With axum, the route
    /// template from `MatchedPath`.
    pub fn route<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> String + Send + Sync + 'static,
    {
        self.route = Some(Arc::new(f));
        self
    }

    /// Which requests the layer guards, besides the policy's methods (default: all).
    pub fn only<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        self.filter = Some(Arc::new(f));
        self
    }

    /// Whether the layer answers status queries (`IDEM-STATUS-4`; default: yes): a `GET`
    /// with an `Idempotency-Status` field, on a route the layer sees and [`Builder::only`]
    /// lets through, is answered from the store with what became of its key (scoped by the
    /// principal and route as the request asked about), and never reaches the inner service.
    /// Off, such a `GET` passes through like any other.
    pub fn status_queries(mut self, enabled: bool) -> Self {
        self.status_queries = enabled;
        self
    }

    /// Called with every event (`IDEM-EVT-1`) and the record's key. The default logs them
    /// with `tracing` (security-relevant ones at `warn`).
    pub fn on_event<F>(mut self, f: F) -> Self
    where
        F: Fn(&Event, &RecordKey) + Send + Sync + 'static,
    {
        self.on_event = Some(Arc::new(f));
        self
    }

    /// The layer, or [`BuildError::NoPrincipal`] when no principal was said.
    pub fn build(self) -> Result<IdempotencyLayer<St>, BuildError> {
        let principal = self.principal.ok_or(BuildError::NoPrincipal)?;
        Ok(IdempotencyLayer {
            shared: Arc::new(Shared {
                store: self.store,
                policy: self.policy,
                principal,
                route: self.route,
                filter: self.filter,
                on_event: self.on_event,
                status_queries: self.status_queries,
                waiters: Default::default(),
            }),
        })
    }
}

/// The idempotency layer: wraps a service with Idempotency-Key semantics on store `St`.
pub struct IdempotencyLayer<St> {
    shared: Arc<Shared<St>>,
}

impl<St> Clone for IdempotencyLayer<St> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<St> IdempotencyLayer<St> {
    /// A builder with idem-core's default policy. A principal is required
    /// ([`Builder::principal`] or [`Builder::single_tenant`]).
    pub fn builder(store: St) -> Builder<St> {
        Builder {
            store,
            policy: Policy::new(Engine::default()),
            principal: None,
            route: None,
            filter: None,
            on_event: None,
            status_queries: true,
        }
    }

    /// The store.
    pub fn store(&self) -> &St {
        &self.shared.store
    }
}

impl<S, St> Layer<S> for IdempotencyLayer<St> {
    type Service = Idempotent<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotent::new(inner, Arc::clone(&self.shared))
    }
}
