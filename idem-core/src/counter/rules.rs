//! The rules of counter keys: the session record, the window, and the compare-and-set writes
//! that open a session, claim a slot, complete it and move the mark.

use super::*;

/// A session just opened (or moved to a new epoch), and the write that records it.
#[must_use = "the session exists only once its write is applied"]
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OpenedSession {
    /// The epoch the client must send.
    pub(crate) epoch: u64,
    /// The first sequence number of the epoch.
    pub(crate) first_seq: u64,
    /// Apply it; a conflict means another open or request won: read and open again.
    pub(crate) write: Write,
}

/// The rules of counter keys.
///
/// A host opens a client's session with the session operation
/// ([`Policy::open_session`](crate::Policy::open_session), typically behind a "register"
/// endpoint or at login) and protects each request with a policy whose keys are counters
/// ([`KeyKind::Counter`](crate::KeyKind::Counter)); both machines apply the rules this type
/// holds ([`Counters::open`], [`Counters::decide`], [`Counters::complete_shared`],
/// [`Counters::extend`], [`Counters::resolve`]: each takes the session record read by the
/// machine and returns the compare-and-set [`Write`] to apply, like [`Engine`]).
///
/// # The session
///
/// Every client has one session record, stored under (the counter scope of the host's scope,
/// client id) with the same compare-and-set contract as any record. It holds the epoch, the
/// **low-water mark** `L` (every sequence serially below it is stale), the **next** number
/// `E` (one past the highest sequence claimed), and one slot per sequence claimed in
/// `[L, E)`: its fingerprint, its lease fence, and its state (in flight, completed with the
/// response, or outcome-unknown). `E - L` never exceeds the window `W`, so a session holds
/// at most `W` results.
///
/// All of a client's state is in that one record, so checking the window and claiming a slot
/// is one compare-and-set: under any interleaving, nothing below the mark runs and no slot
/// runs twice (`IDEM-CTR-12`). The price is that a client's requests contend for one record
/// (a lost race decides again), which is what a single producer's pipeline costs anyway. A
/// design with one record per sequence plus a session record would need two writes to be
/// atomic, which a store with single-key compare-and-set cannot promise.
///
/// # Rules, for a request (client, epoch, s) with fingerprint f
///
/// Numbers are compared with RFC 1982 serial-number arithmetic modulo 2^N, and the window is
/// at most 2^(N-2), so every comparison below is defined (`IDEM-CTR-2`).
///
/// 1. No session: [`RejectReason::UnknownClient`] (`IDEM-CTR-3`). Sessions are opened with
///    [`Counters::open`]: a new session gets a random epoch, so a request from a session that
///    expired can never match a later one.
/// 2. Another epoch: older → [`RejectReason::StaleEpoch`], newer → [`RejectReason::UnknownEpoch`]
///    (`IDEM-CTR-4`). Epochs change only through [`Counters::open`], which resets the window
///    (`IDEM-CTR-5`).
/// 3. The request may carry the client's low-water mark: it moves `L` forward (never back,
///    never beyond `E`, never past a slot that is in flight or outcome-unknown), dropping the
///    results below it (`IDEM-CTR-11`).
/// 4. `s` below `L`: [`RejectReason::Stale`], never executed again (`IDEM-CTR-6`).
/// 5. `s` in `[L, E)` with a slot: a retry if f matches (replay, in-progress, or takeover of
///    an expired lease), [`RejectReason::Collision`] otherwise, including a counter that
///    wrapped onto a slot still in flight or retained (`IDEM-CTR-7`).
/// 6. `s` in `[L, E)` without a slot (a number skipped earlier, or released by a retryable
///    outcome): execute.
/// 7. `s` at or after `E`: if it skips `W` or more numbers, [`RejectReason::SequenceGap`]
///    (`IDEM-CTR-9`). Otherwise execute, with `E = s + 1` (`IDEM-CTR-8`); if `s` is not
///    inside `[L, L + W)` the window slides to `[s - W + 1, s]`, dropping the results below,
///    but only over completed or unused slots: a slot in flight or outcome-unknown is never
///    dropped or overwritten, and the request is refused with [`RejectReason::WindowFull`]
///    (`IDEM-CTR-10`).
///
/// Completions are fenced per slot: a completion or heartbeat whose slot was taken over, left
/// the window, or belongs to an old epoch changes nothing (`IDEM-CTR-13`).
#[derive(Clone, Debug)]
pub(crate) struct Counters {
    engine: Config,
    config: CounterConfig,
}

impl Counters {
    /// Counters with the lease, retention and unknown-outcome policy of `engine`.
    pub(crate) fn new(engine: Engine, config: CounterConfig) -> Result<Counters, KindConfigError> {
        config.check()?;
        Ok(Counters {
            engine: engine.config().clone(),
            config,
        })
    }

    /// The engine settings: lease, retention, unknown-outcome policy.
    pub(crate) fn engine_config(&self) -> &Config {
        &self.engine
    }

    /// The settings.
    pub(crate) fn config(&self) -> &CounterConfig {
        &self.config
    }

    /// Where the session of `client` lives: in the counter scope of `scope` (`IDEM-KIND-1`).
    pub(crate) fn session_key(&self, scope: &Scope, client: &str) -> RecordKey {
        RecordKey::new(kind_scope(scope, "counter"), client)
    }

    /// Opens the session of `client`, or moves it to a new epoch, with `first_seq` as the
    /// first sequence number (`IDEM-CTR-3`, `IDEM-CTR-5`). A new session takes its epoch
    /// from the random `nonce`; an existing one moves to the next epoch, which drops its
    /// window: requests of the old epoch are refused from then on, and a handler still
    /// running for one is fenced out. `stored` is the record read under
    /// [`Counters::session_key`].
    pub(crate) fn open(
        &self,
        now: UnixMillis,
        scope: &Scope,
        client: &str,
        first_seq: u64,
        stored: Option<&Record>,
        nonce: u64,
    ) -> Result<OpenedSession, CounterError> {
        if !valid_client_id(client) {
            return Err(CounterError::BadClientId);
        }
        if first_seq > mask(self.config.bits) {
            return Err(CounterError::SequenceBeyondBits {
                seq: first_seq,
                bits: self.config.bits,
            });
        }
        let live = stored.and_then(|r| live_session(now, r));
        let epoch = match live {
            Some(s) => s.epoch.wrapping_add(1),
            // Half the range, so that the next epochs are larger for a long time.
            None => nonce >> 1,
        };
        let (version, precondition, created) = match stored {
            Some(r) => (
                r.version.wrapping_add(1),
                Precondition::Version(r.version),
                if live.is_some() { r.created } else { now },
            ),
            None => (nonce, Precondition::Absent, now),
        };
        let session = CounterSession {
            epoch,
            bits: self.config.bits,
            window: self.config.window,
            low: first_seq,
            next: first_seq,
            slots: Vec::new(),
        };
        Ok(OpenedSession {
            epoch,
            first_seq,
            write: Write {
                key: self.session_key(scope, client),
                precondition,
                op: WriteOp::Put(session_record(
                    version,
                    created,
                    now.saturating_add(self.engine.key_ttl),
                    session,
                )),
            },
        })
    }

    /// Decides one request, given the session record read under [`Counters::session_key`]
    /// (`IDEM-CTR-3` to `IDEM-CTR-12`).
    pub(crate) fn decide(
        &self,
        now: UnixMillis,
        attempt: &CounterAttempt<'_>,
        stored: Option<&Record>,
    ) -> CounterDecision {
        use CounterDecision::Rejected;
        let Some(record) = stored else {
            return Rejected(RejectReason::UnknownClient);
        };
        let Some(session) = live_session(now, record) else {
            return Rejected(RejectReason::UnknownClient);
        };
        let key = attempt.key;
        match key.epoch.cmp(&session.epoch) {
            Ordering::Less => return Rejected(RejectReason::StaleEpoch),
            Ordering::Greater => return Rejected(RejectReason::UnknownEpoch),
            Ordering::Equal => {}
        }
        let m = session.mask();
        if key.seq > m || attempt.low_water.is_some_and(|w| w > m) {
            return Rejected(RejectReason::InvalidSequence);
        }
        let half = 1u64 << (session.bits - 1);
        let window = u64::from(session.window);
        let used = session.dist(session.low, session.next);

        // The client's mark: forward only, up to `next`, never past an unsettled slot.
        let mut low = session.low;
        if let Some(w) = attempt.low_water {
            let d = session.dist(session.low, w);
            if d < half {
                if d > used {
                    return Rejected(RejectReason::InvalidLowWater);
                }
                low = session
                    .first_unsettled_between(session.low, w)
                    .map_or(w, |s| s.seq);
            }
        }

        let d = session.dist(low, key.seq);
        if d >= half {
            return Rejected(RejectReason::Stale);
        }
        let used = session.dist(low, session.next);
        if d < used {
            return match session.slot(key.seq) {
                Some(slot) => self.retry(now, attempt, record, session, slot, low),
                None => self.execute(now, attempt, record, session, low, session.next, None),
            };
        }
        if d - used >= window {
            return Rejected(RejectReason::SequenceGap { next: session.next });
        }
        let new_low = if d >= window {
            key.seq.wrapping_sub(window - 1) & m
        } else {
            low
        };
        if let Some(blocker) = session.first_unsettled_between(low, new_low) {
            let retry_after_secs = match blocker.state {
                SlotState::InFlight { lease_expires } => {
                    self.engine.retry_after(now, lease_expires)
                }
                _ => RETRY_SOON_SECS,
            };
            return Rejected(RejectReason::WindowFull { retry_after_secs });
        }
        let next = key.seq.wrapping_add(1) & m;
        self.execute(now, attempt, record, session, new_low, next, None)
    }

    /// A request whose slot exists.
    fn retry(
        &self,
        now: UnixMillis,
        attempt: &CounterAttempt<'_>,
        record: &Record,
        session: &CounterSession,
        slot: &CounterSlot,
        low: u64,
    ) -> CounterDecision {
        if !slot.fingerprint.matches(attempt.fingerprint) {
            return CounterDecision::Rejected(RejectReason::Collision);
        }
        match &slot.state {
            SlotState::Completed { response } => CounterDecision::Replay(Arc::clone(response)),
            SlotState::OutcomeUnknown { .. } => {
                CounterDecision::Rejected(RejectReason::OutcomeUnknown)
            }
            SlotState::InFlight { lease_expires } if now < *lease_expires => {
                CounterDecision::InProgress {
                    retry_after_secs: self.engine.retry_after(now, *lease_expires),
                }
            }
            SlotState::InFlight { .. } => {
                self.execute(now, attempt, record, session, low, session.next, Some(slot))
            }
        }
    }

    /// Claims `attempt.key.seq` in a session whose window becomes `[low, next)`; `previous`
    /// is the slot being taken over, if any.
    #[allow(clippy::too_many_arguments)]
    fn execute(
        &self,
        now: UnixMillis,
        attempt: &CounterAttempt<'_>,
        record: &Record,
        session: &CounterSession,
        low: u64,
        next: u64,
        previous: Option<&CounterSlot>,
    ) -> CounterDecision {
        let seq = attempt.key.seq;
        let fence = previous.map_or(1, |p| p.fence.wrapping_add(1));
        let expires = now.saturating_add(self.engine.lease);
        let mut slots: Vec<CounterSlot> = Vec::with_capacity(session.slots.len() + 1);
        let used = session.dist(low, next);
        let new = CounterSlot {
            seq,
            fence,
            fingerprint: attempt.fingerprint.clone(),
            state: SlotState::InFlight {
                lease_expires: expires,
            },
        };
        let at = session.dist(low, seq);
        let mut placed = false;
        for s in &session.slots {
            let d = session.dist(low, s.seq);
            if d >= used {
                // Below the new mark (it wrapped to a large distance): dropped.
                continue;
            }
            if !placed && d >= at {
                slots.push(new.clone());
                placed = true;
                if d == at {
                    continue;
                }
            }
            slots.push(s.clone());
        }
        if !placed {
            slots.push(new);
        }
        let next_session = CounterSession {
            epoch: session.epoch,
            bits: session.bits,
            window: session.window,
            low,
            next,
            slots,
        };
        let key = RecordKey::new(
            kind_scope(attempt.scope, "counter"),
            attempt.key.client.as_str(),
        );
        let lease = CounterLease {
            session: key.clone(),
            epoch: session.epoch,
            seq,
            fence,
            expires,
        };
        let write = self.rewrite(now, key, record, next_session);
        CounterDecision::Execute {
            lease,
            write,
            recovered: previous.is_some(),
        }
    }

    /// The write that replaces `record`'s session.
    fn rewrite(
        &self,
        now: UnixMillis,
        key: RecordKey,
        record: &Record,
        session: CounterSession,
    ) -> Write {
        Write {
            key,
            precondition: Precondition::Version(record.version),
            op: WriteOp::Put(session_record(
                record.version.wrapping_add(1),
                record.created,
                record
                    .key_expires
                    .max(now.saturating_add(self.engine.key_ttl)),
                session,
            )),
        }
    }

    /// The slot `lease` holds in `stored`, checked (`IDEM-CTR-13`).
    fn held<'r>(
        &self,
        now: UnixMillis,
        lease: &CounterLease,
        stored: Option<&'r Record>,
    ) -> Result<(&'r Record, &'r CounterSession, usize), CounterError> {
        let record = stored.ok_or(CounterError::FencedOut)?;
        let session = live_session(now, record).ok_or(CounterError::FencedOut)?;
        if session.epoch != lease.epoch {
            return Err(CounterError::FencedOut);
        }
        let i = session
            .slots
            .iter()
            .position(|s| {
                s.seq == lease.seq
                    && s.fence == lease.fence
                    && matches!(s.state, SlotState::InFlight { .. })
            })
            .ok_or(CounterError::FencedOut)?;
        Ok((record, session, i))
    }

    /// The write that records the handler's outcome under `lease`, given the session record
    /// read now (`IDEM-CTR-13`), and what applying it will mean: a final outcome is stored in
    /// the slot and replayed; a retryable one frees the slot (the number may run again); an
    /// unknown one follows the engine's [`UnknownOutcomePolicy`]. Apply it before the response
    /// leaves the host; a lost race means read and complete again (the machine does). The
    /// response is shared, so that a completion can be rebuilt without copying it.
    pub(crate) fn complete_shared(
        &self,
        now: UnixMillis,
        lease: &CounterLease,
        outcome: SharedOutcome,
        stored: Option<&Record>,
    ) -> Result<(Write, Finish), CounterError> {
        let (record, session, i) = self.held(now, lease, stored)?;
        let mut next = session.clone();
        let finish = match outcome {
            SharedOutcome::Final(response) => {
                next.slots[i].state = completed(response)?;
                Finish::Stored
            }
            SharedOutcome::Retryable => {
                next.slots.remove(i);
                Finish::Released
            }
            SharedOutcome::Unknown(response) => match (self.engine.unknown_outcome, response) {
                (UnknownOutcomePolicy::Store, Some(response)) => {
                    next.slots[i].state = completed(response)?;
                    Finish::Stored
                }
                (UnknownOutcomePolicy::Reexecute, _) => {
                    next.slots[i].state = SlotState::InFlight { lease_expires: now };
                    Finish::OutcomeUnknown
                }
                (UnknownOutcomePolicy::Hold | UnknownOutcomePolicy::Store, _) => {
                    next.slots[i].state = SlotState::OutcomeUnknown { since: now };
                    Finish::OutcomeUnknown
                }
            },
        };
        Ok((
            self.rewrite(now, lease.session.clone(), record, next),
            finish,
        ))
    }

    /// A heartbeat: the lease extended to one lease period from `now`, and its write.
    /// Refused once the lease has ended or the slot was taken over.
    pub(crate) fn extend(
        &self,
        now: UnixMillis,
        lease: &CounterLease,
        stored: Option<&Record>,
    ) -> Result<(CounterLease, Write), CounterError> {
        if now >= lease.expires {
            return Err(CounterError::LeaseExpired);
        }
        let (record, session, i) = self.held(now, lease, stored)?;
        let expires = now.saturating_add(self.engine.lease);
        let mut next = session.clone();
        next.slots[i].state = SlotState::InFlight {
            lease_expires: expires,
        };
        let write = self.rewrite(now, lease.session.clone(), record, next);
        Ok((
            CounterLease {
                expires,
                ..lease.clone()
            },
            write,
        ))
    }

    /// Reconciles a slot held as outcome-unknown: a final outcome stores the response, a
    /// retryable one frees the slot.
    // No operation reconciles a held outcome yet; the rule is kept, and unit-tested, for it.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn resolve(
        &self,
        now: UnixMillis,
        session_key: &RecordKey,
        seq: u64,
        outcome: Outcome,
        stored: Option<&Record>,
    ) -> Result<Write, CounterError> {
        let record = stored.ok_or(CounterError::FencedOut)?;
        let session = live_session(now, record).ok_or(CounterError::FencedOut)?;
        let i = session
            .slots
            .iter()
            .position(|s| s.seq == seq)
            .ok_or(CounterError::FencedOut)?;
        if !matches!(session.slots[i].state, SlotState::OutcomeUnknown { .. }) {
            return Err(CounterError::NotOutcomeUnknown);
        }
        let mut next = session.clone();
        match outcome {
            Outcome::Final(response) | Outcome::Unknown(Some(response)) => {
                next.slots[i].state = completed(Arc::new(response))?;
            }
            Outcome::Retryable | Outcome::Unknown(None) => {
                next.slots.remove(i);
            }
        }
        Ok(self.rewrite(now, session_key.clone(), record, next))
    }
}

fn completed(response: Arc<StoredResponse>) -> Result<SlotState, CounterError> {
    if !(100..=599).contains(&response.status) {
        return Err(CounterError::InvalidStatus(response.status));
    }
    Ok(SlotState::Completed { response })
}

/// The session in `record`, unless its key has expired.
fn live_session(now: UnixMillis, record: &Record) -> Option<&CounterSession> {
    match &record.state {
        RecordState::Counter { session } if now < record.key_expires => Some(session),
        _ => None,
    }
}

fn session_record(
    version: u64,
    created: UnixMillis,
    key_expires: UnixMillis,
    session: CounterSession,
) -> Record {
    Record {
        version,
        // Sessions fence per slot; the record's own fence and fingerprint are unused.
        fence: 0,
        fingerprint: Fingerprint::from_digest([0; 32]),
        created,
        key_expires,
        state: RecordState::Counter {
            session: Arc::new(session),
        },
    }
}
