//! The codes that cross as numbers: the steps of the request machine, the handler's outcome,
//! the heartbeat states, the delivery outcomes and store failures as `#[wasm_bindgen]` enums the JavaScript
//! side imports by name, and events as indices into the core's list ([`Event::ALL`]), with
//! the names JavaScript reads them by.

use alloc::string::String;
use alloc::vec::Vec;
use idem_core::Event;

/// The steps of the request machine ([`idem_core::Step`]), as the JavaScript side sees
/// them: what a slot's `poll` returns.
#[cfg_attr(feature = "server", wasm_bindgen::prelude::wasm_bindgen)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// Read the record (or ask the store that claims itself).
    Claim = 0,
    /// Read the record.
    Load = 1,
    /// Apply the write of `takeWrite`.
    Apply = 2,
    /// Poll again at `waitUntil`.
    WaitUntil = 3,
    /// Run the handler.
    Run = 4,
    /// Waiting for an input.
    Idle = 5,
    /// Send the reply.
    Reply = 6,
    /// The outcome is recorded: send the handler's response.
    Done = 7,
}

/// What the handler's run came to.
#[cfg_attr(feature = "server", wasm_bindgen::prelude::wasm_bindgen)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ran {
    /// It answered: the response is classified by status (`IDEM-OUT-4`).
    Answered = 0,
    /// It threw, or its response could not be read: an unknown outcome (`IDEM-OUT-3`).
    Threw = 1,
    /// It reports that nothing happened: the key is released (`IDEM-OUT-2`).
    NothingHappened = 2,
    /// A delivery's processing is done ([`idem_core::Inbox::processed`]).
    Processed = 3,
    /// It answered with a body longer than the store keeps, which the host passes through
    /// as it is produced: classified by status, stored as `response-not-stored`
    /// (`IDEM-STORE-5`).
    Oversized = 4,
    /// It answered with trailer fields, which a stored answer does not carry, and which the
    /// host sends with the answer as it is: classified by status, stored as
    /// `response-not-stored` (`IDEM-STORE-5`).
    Trailed = 5,
}

/// Where a request's heartbeats stand ([`idem_core::Heartbeat`]).
#[cfg_attr(feature = "server", wasm_bindgen::prelude::wasm_bindgen)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeartbeatState {
    /// None asked for, or one is on its way.
    Quiet = 0,
    /// The lease was extended.
    Extended = 1,
    /// The lease was taken over, or the outcome is already in (`IDEM-LEASE-2`).
    FencedOut = 2,
    /// The lease had ended (`IDEM-LEASE-3`).
    Expired = 3,
    /// The store failed (`IDEM-STORE-4`).
    Failed = 4,
}

impl HeartbeatState {
    /// The state of a core heartbeat.
    pub fn of(h: idem_core::Heartbeat) -> HeartbeatState {
        match h {
            idem_core::Heartbeat::Quiet => HeartbeatState::Quiet,
            idem_core::Heartbeat::Extended(_) => HeartbeatState::Extended,
            idem_core::Heartbeat::FencedOut => HeartbeatState::FencedOut,
            idem_core::Heartbeat::Expired => HeartbeatState::Expired,
            idem_core::Heartbeat::Failed(_) => HeartbeatState::Failed,
        }
    }
}

/// What became of a delivery to an inbox ([`idem_core::Delivery`]), as JavaScript reads it:
/// its name is `deliveryNames()[outcome]`.
#[cfg_attr(feature = "server", wasm_bindgen::prelude::wasm_bindgen)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// Processed now.
    Processed = 0,
    /// Processed now, taking over from a delivery whose processing was interrupted.
    Recovered = 1,
    /// Already processed: acknowledge it.
    Duplicate = 2,
    /// Another delivery is being processed: deliver again later.
    InProgress = 3,
    /// The same id with another payload: acknowledged, not processed.
    Conflict = 4,
    /// An earlier delivery's outcome is held: not acknowledged.
    Held = 5,
    /// Processing failed: deliver again.
    Failed = 6,
    /// Refused before it was claimed.
    Refused = 7,
}

/// How a store call failed, as the JavaScript side reports it (`storeFailed`): the
/// [`StoreFailure`](idem_core::StoreFailure)s by number.
#[cfg_attr(feature = "server", wasm_bindgen::prelude::wasm_bindgen)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreFailed {
    /// Unreachable, timed out, refused (`IDEM-STORE-4`).
    Unavailable = 0,
    /// Full: it refuses new records (`IDEM-STORE-3`).
    Full = 1,
    /// A sealed record it cannot open (`IDEM-SEAL-3`).
    Sealed = 2,
    /// A completion that was to commit the handler's transaction failed (`IDEM-STORE-7`).
    Uncommitted = 3,
}

impl From<StoreFailed> for idem_core::StoreFailure {
    fn from(failed: StoreFailed) -> Self {
        match failed {
            StoreFailed::Unavailable => idem_core::StoreFailure::Unavailable,
            StoreFailed::Full => idem_core::StoreFailure::Full,
            StoreFailed::Sealed => idem_core::StoreFailure::Sealed,
            StoreFailed::Uncommitted => idem_core::StoreFailure::Uncommitted,
        }
    }
}

impl DeliveryOutcome {
    /// The outcome of a core delivery.
    pub fn of(d: &idem_core::Delivery) -> DeliveryOutcome {
        use idem_core::Delivery;
        match d {
            Delivery::Processed { recovered: false } => DeliveryOutcome::Processed,
            Delivery::Processed { recovered: true } => DeliveryOutcome::Recovered,
            Delivery::Duplicate => DeliveryOutcome::Duplicate,
            Delivery::InProgress { .. } => DeliveryOutcome::InProgress,
            Delivery::Conflict { .. } => DeliveryOutcome::Conflict,
            Delivery::Held => DeliveryOutcome::Held,
            Delivery::Failed => DeliveryOutcome::Failed,
            _ => DeliveryOutcome::Refused,
        }
    }

    /// Every outcome, by index, with a core delivery of its kind.
    pub const ALL: [(DeliveryOutcome, idem_core::Delivery); 8] = [
        (
            DeliveryOutcome::Processed,
            idem_core::Delivery::Processed { recovered: false },
        ),
        (
            DeliveryOutcome::Recovered,
            idem_core::Delivery::Processed { recovered: true },
        ),
        (DeliveryOutcome::Duplicate, idem_core::Delivery::Duplicate),
        (
            DeliveryOutcome::InProgress,
            idem_core::Delivery::InProgress {
                retry_after_secs: 0,
            },
        ),
        (
            DeliveryOutcome::Conflict,
            idem_core::Delivery::Conflict {
                differing: Vec::new(),
            },
        ),
        (DeliveryOutcome::Held, idem_core::Delivery::Held),
        (DeliveryOutcome::Failed, idem_core::Delivery::Failed),
        (DeliveryOutcome::Refused, idem_core::Delivery::Refused),
    ];
}

/// The names of the delivery outcomes in index order, comma-separated, and which of them the
/// sender is told were received (a bit mask over the indices): the core's.
pub fn delivery_names() -> (String, u32) {
    let mut names = String::new();
    let mut acknowledged = 0;
    for (i, (outcome, delivery)) in DeliveryOutcome::ALL.iter().enumerate() {
        debug_assert_eq!(*outcome as usize, i);
        if i > 0 {
            names.push(',');
        }
        names.push_str(delivery.name());
        if delivery.acknowledge() {
            acknowledged |= 1 << i;
        }
    }
    (names, acknowledged)
}

/// The index of `event` in [`Event::ALL`] (events with data compare by name).
pub fn event_index(event: Event) -> Option<u8> {
    Event::ALL
        .iter()
        .position(|e| e.name() == event.name())
        .map(|i| i as u8)
}

/// The names of [`Event::ALL`], comma-separated, in index order.
pub fn event_names() -> String {
    let mut out = String::new();
    for (i, e) in Event::ALL.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(e.name());
    }
    out
}

/// A bit mask over event indices: the security-relevant events (`IDEM-EVT-1`).
pub fn security_mask() -> u32 {
    Event::ALL
        .iter()
        .enumerate()
        .filter(|(_, e)| e.is_security_relevant())
        .fold(0, |mask, (i, _)| mask | (1 << i))
}

/// The `about:blank` problem of the HTTP edge ([`Plain`](idem_core::Plain)) with this status,
/// if the core has one: 400, 404, 405, 500, 503.
pub fn plain_of(status: u16) -> Option<idem_core::Plain> {
    use idem_core::Plain;
    [
        Plain::BadRequest,
        Plain::NotFound,
        Plain::MethodNotAllowed,
        Plain::Internal,
        Plain::Unavailable,
    ]
    .into_iter()
    .find(|p| p.status() == status)
}
