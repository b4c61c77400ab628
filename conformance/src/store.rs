//! The reference server's store: idem-tower's memory store (one process), or its Redis or
//! Postgres store (`serve --store URL`, with the features `redis` and `postgres`), where
//! several server processes share the records and the count of executions.

use idem_core::{
    Applied, AsyncStore, Completing, Record, RecordKey, StoreFailure, UnixMillis, Write,
};
use idem_tower::MemoryStore;
#[cfg(feature = "postgres")]
use idem_tower::PostgresStore;
#[cfg(feature = "redis")]
use idem_tower::RedisStore;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where the reference server keeps its records.
pub enum RefStore {
    /// One process.
    Memory(MemoryStore, AtomicU64),
    /// Shared through Redis; the execution count is a Redis counter.
    #[cfg(feature = "redis")]
    Redis(RedisStore, redis::aio::ConnectionManager),
    /// Shared through Postgres; the execution count is a row.
    #[cfg(feature = "postgres")]
    Postgres(PostgresStore),
}

/// The keys that seal the records of the reference server's store.
#[cfg(feature = "seal")]
pub use idem_tower::Seal;

/// The keys that seal the records of the reference server's store: none exist in a build
/// without the feature `seal` (`--seal-env` is refused before one could be made).
#[cfg(not(feature = "seal"))]
#[derive(Debug, Clone)]
pub enum Seal {}

#[cfg(not(feature = "seal"))]
impl Seal {
    /// The ids of the keys, the sealing one first.
    pub fn key_ids(&self) -> std::iter::Empty<&str> {
        match *self {}
    }
}

/// The stores a URL can name.
enum Kind {
    Memory,
    Redis,
    Postgres,
}

fn kind(url: &str) -> Result<Kind, String> {
    let scheme = url.split_once("://").map(|(s, _)| s);
    let kind = match (url, scheme) {
        ("memory", _) => Kind::Memory,
        (_, Some("redis" | "rediss")) => Kind::Redis,
        (_, Some("postgres" | "postgresql")) => Kind::Postgres,
        _ => {
            return Err(format!(
                "--store {}: use memory, redis://HOST:PORT or postgres://USER@HOST:PORT/DB",
                shown(url)
            ))
        }
    };
    let missing = match kind {
        Kind::Redis if cfg!(not(feature = "redis")) => Some("redis"),
        Kind::Postgres if cfg!(not(feature = "postgres")) => Some("postgres"),
        _ => None,
    };
    match missing {
        Some(feature) => Err(format!(
            "--store {}: this build has no {feature} store; install it with \
             `cargo install idem-conformance --features {feature}`",
            shown(url)
        )),
        None => Ok(kind),
    }
}

/// The key of the shared execution count in Redis.
#[cfg(feature = "redis")]
const REDIS_COUNT: &str = "idem-conformance:executions";

/// Why a store call failed.
#[derive(Debug)]
pub struct RefStoreError {
    message: String,
    failure: StoreFailure,
}

impl fmt::Display for RefStoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RefStoreError {}

#[cfg(any(feature = "redis", feature = "postgres"))]
fn error(e: impl fmt::Display) -> RefStoreError {
    RefStoreError {
        message: e.to_string(),
        failure: StoreFailure::Unavailable,
    }
}

/// The memory store, sealed with `seal` if given.
#[cfg(feature = "seal")]
fn sealed(memory: MemoryStore, seal: Option<Seal>) -> MemoryStore {
    match seal {
        Some(seal) => memory.with_seal(seal),
        None => memory,
    }
}

/// The memory store (no seal exists in this build).
#[cfg(not(feature = "seal"))]
fn sealed(memory: MemoryStore, seal: Option<Seal>) -> MemoryStore {
    match seal {
        Some(seal) => match seal {},
        None => memory,
    }
}

/// A failure of one of idem-tower's stores, as that store means it.
fn failed_as<St: AsyncStore>(e: St::Error) -> RefStoreError
where
    St::Error: fmt::Display,
{
    RefStoreError {
        failure: St::failure(&e),
        message: e.to_string(),
    }
}

impl RefStore {
    /// Which store `url` names: `memory`, `redis://…` or `postgres://…`.
    pub fn check(url: &str) -> Result<(), String> {
        kind(url).map(|_| ())
    }

    /// A store for `url` (`None`: memory), its records sealed with `seal`. A Postgres store
    /// runs its migration and creates the execution count. Errors show the URL without its
    /// password.
    pub async fn open(
        url: Option<&str>,
        seal: Option<Seal>,
        memory: MemoryStore,
    ) -> Result<RefStore, String> {
        let Some(u) = url else {
            return Ok(RefStore::Memory(sealed(memory, seal), AtomicU64::new(0)));
        };
        #[cfg(any(feature = "redis", feature = "postgres"))]
        let failed = |e: &dyn fmt::Display| format!("--store {}: {e}", shown(u));
        match kind(u)? {
            Kind::Memory => Ok(RefStore::Memory(sealed(memory, seal), AtomicU64::new(0))),
            #[cfg(feature = "redis")]
            Kind::Redis => {
                let mut store = RedisStore::connect(u).await.map_err(|e| failed(&e))?;
                if let Some(seal) = seal {
                    store = store.with_seal(seal);
                }
                let conn = store.connection();
                Ok(RefStore::Redis(store, conn))
            }
            #[cfg(feature = "postgres")]
            Kind::Postgres => {
                let mut store = PostgresStore::connect(u, 64).map_err(|e| failed(&e))?;
                if let Some(seal) = seal {
                    store = store.with_seal(seal);
                }
                store.migrate().await.map_err(|e| failed(&e))?;
                let client = store.pool().get().await.map_err(|e| failed(&e))?;
                client
                    .batch_execute(
                        "CREATE TABLE IF NOT EXISTS idem_conformance_executions (one boolean PRIMARY KEY DEFAULT true, n bigint NOT NULL);
                         INSERT INTO idem_conformance_executions (n) VALUES (0) ON CONFLICT DO NOTHING;",
                    )
                    .await
                    .map_err(|e| failed(&e))?;
                Ok(RefStore::Postgres(store))
            }
            // `kind` refuses a store this build has not.
            #[allow(unreachable_patterns)]
            _ => Err(format!("--store {}: not in this build", shown(u))),
        }
    }

    /// The memory store, when the records are in this process.
    pub fn memory(&self) -> Option<&MemoryStore> {
        match self {
            RefStore::Memory(m, _) => Some(m),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// Counts one execution of the handler, in the store when it is shared.
    pub async fn count_execution(&self) -> Result<u64, RefStoreError> {
        match self {
            RefStore::Memory(_, n) => Ok(n.fetch_add(1, Ordering::SeqCst) + 1),
            #[cfg(feature = "redis")]
            RefStore::Redis(_, conn) => {
                let mut conn = conn.clone();
                redis::cmd("INCR")
                    .arg(REDIS_COUNT)
                    .query_async(&mut conn)
                    .await
                    .map_err(error)
            }
            #[cfg(feature = "postgres")]
            RefStore::Postgres(store) => {
                let client = store.pool().get().await.map_err(error)?;
                let row = client
                    .query_one(
                        "UPDATE idem_conformance_executions SET n = n + 1 RETURNING n",
                        &[],
                    )
                    .await
                    .map_err(error)?;
                Ok(row.get::<_, i64>(0) as u64)
            }
        }
    }

    /// How many times the handler has run (in every process that shares the store).
    pub async fn executions(&self) -> Result<u64, RefStoreError> {
        match self {
            RefStore::Memory(_, n) => Ok(n.load(Ordering::SeqCst)),
            #[cfg(feature = "redis")]
            RefStore::Redis(_, conn) => {
                let mut conn = conn.clone();
                let n: Option<u64> = redis::cmd("GET")
                    .arg(REDIS_COUNT)
                    .query_async(&mut conn)
                    .await
                    .map_err(error)?;
                Ok(n.unwrap_or(0))
            }
            #[cfg(feature = "postgres")]
            RefStore::Postgres(store) => {
                let client = store.pool().get().await.map_err(error)?;
                let row = client
                    .query_one("SELECT n FROM idem_conformance_executions", &[])
                    .await
                    .map_err(error)?;
                Ok(row.get::<_, i64>(0) as u64)
            }
        }
    }
}

impl AsyncStore for RefStore {
    type Error = RefStoreError;

    async fn load(&self, key: &RecordKey) -> Result<Option<Record>, RefStoreError> {
        match self {
            RefStore::Memory(m, _) => m.load(key).await.map_err(failed_as::<MemoryStore>),
            #[cfg(feature = "redis")]
            RefStore::Redis(r, _) => r.load(key).await.map_err(failed_as::<RedisStore>),
            #[cfg(feature = "postgres")]
            RefStore::Postgres(p) => p.load(key).await.map_err(failed_as::<PostgresStore>),
        }
    }

    async fn apply(&self, now: UnixMillis, write: Write) -> Result<Applied, RefStoreError> {
        match self {
            RefStore::Memory(m, _) => m.apply(now, write).await.map_err(failed_as::<MemoryStore>),
            #[cfg(feature = "redis")]
            RefStore::Redis(r, _) => r.apply(now, write).await.map_err(error),
            #[cfg(feature = "postgres")]
            RefStore::Postgres(p) => p.apply(now, write).await.map_err(error),
        }
    }

    async fn apply_completion(
        &self,
        now: UnixMillis,
        write: Write,
        completion: Completing,
    ) -> Result<Applied, RefStoreError> {
        match self {
            RefStore::Memory(m, _) => m
                .apply_completion(now, write, completion)
                .await
                .map_err(failed_as::<MemoryStore>),
            #[cfg(feature = "redis")]
            RefStore::Redis(r, _) => r
                .apply_completion(now, write, completion)
                .await
                .map_err(error),
            #[cfg(feature = "postgres")]
            RefStore::Postgres(p) => p
                .apply_completion(now, write, completion)
                .await
                .map_err(error),
        }
    }

    fn failure(error: &RefStoreError) -> StoreFailure {
        error.failure
    }
}

/// A store URL as it may be shown: its password, if any, replaced by `***`.
pub fn shown(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(u) => u.to_string(),
        // Without an `@` there is no password to hide.
        Err(_) if !url.contains('@') => url.to_owned(),
        Err(_) => "(an unparsable URL)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_url_is_shown_without_its_password() {
        assert_eq!(
            shown("postgres://app:s3cret@db:5432/app"),
            "postgres://app:***@db:5432/app"
        );
        assert_eq!(shown("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert!(RefStore::check("memory").is_ok());
        assert!(RefStore::check("mysql://x").is_err());
    }

    #[test]
    fn a_store_this_build_has_not_is_refused_with_the_feature_that_adds_it() {
        for (url, feature, built) in [
            ("redis://127.0.0.1:6379", "redis", cfg!(feature = "redis")),
            (
                "postgres://u@db/app",
                "postgres",
                cfg!(feature = "postgres"),
            ),
        ] {
            match RefStore::check(url) {
                Ok(()) => assert!(built, "{url} accepted without the feature {feature}"),
                Err(e) => {
                    assert!(!built, "{url} refused with the feature {feature}: {e}");
                    assert!(e.contains(&format!("--features {feature}")), "{e}");
                }
            }
        }
    }
}
