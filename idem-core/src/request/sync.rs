//! The request machine over a synchronous [`Store`], as [`Store::claim`] and
//! [`Store::finish`] and the key kinds' own claim and finish functions drive it.

use super::*;

impl From<Claimed> for Claim {
    /// The claim of a record lease (a counter slot's lease has no [`Claim`]; it reads as
    /// contended).
    fn from(c: Claimed) -> Claim {
        match c {
            Claimed::Execute {
                hold: Hold::Record(lease),
                recovered,
            } => Claim::Execute {
                lease: Box::new(lease),
                recovered,
            },
            Claimed::Execute { .. } => Claim::Done(Decision::CONTENDED),
            Claimed::Done(d) => Claim::Done(d),
        }
    }
}

/// The rules of the other key kinds, for their own claim and finish functions.
impl<'a> Request<'a> {
    pub(crate) fn for_time(
        keys: &TimeKeys,
        scope: &Scope,
        key: &TimeKey,
        fingerprint: &'a Fingerprint,
        nonce: u64,
    ) -> Request<'a> {
        Request::with_rules(
            Rules::Time(keys.clone()),
            Cow::Owned(keys.record_key(scope, key)),
            Cow::Borrowed(fingerprint),
            Subject::Time(key.clone()),
            nonce,
        )
    }

    pub(crate) fn for_token(
        tokens: &Tokens,
        scope: &Scope,
        token: &str,
        fingerprint: &'a Fingerprint,
        nonce: u64,
    ) -> Request<'a> {
        Request::with_rules(
            Rules::Token(tokens.clone()),
            Cow::Owned(tokens.record_key(scope, token)),
            Cow::Borrowed(fingerprint),
            Subject::Token {
                scope: scope.clone(),
                token: String::from(token),
            },
            nonce,
        )
    }

    pub(crate) fn for_counter(counters: &Counters, attempt: &CounterAttempt<'a>) -> Request<'a> {
        Request::with_rules(
            Rules::Counter(counters.clone()),
            Cow::Owned(counters.session_key(attempt.scope, &attempt.key.client)),
            Cow::Borrowed(attempt.fingerprint),
            Subject::Counter {
                scope: attempt.scope.clone(),
                key: attempt.key.clone(),
                low_water: attempt.low_water,
            },
            0,
        )
    }

    pub(crate) fn holding_slot(counters: &Counters, lease: &'a CounterLease) -> Request<'a> {
        Request::held(
            Rules::Counter(counters.clone()),
            Cow::Borrowed(&lease.session),
            Held::Slot(Cow::Borrowed(lease)),
        )
    }
}

impl<'a> Request<'a> {
    /// Runs the claim over `store` with no waiting, as [`Store::claim`] answers it.
    pub(crate) fn claim_on<S: Store + ?Sized>(
        &mut self,
        store: &mut S,
        now: UnixMillis,
    ) -> Result<Claimed, S::Error> {
        // Without waiting, driving ends at Run (claimed) or Reply (decided).
        self.drive_then(store, now, &mut Waiters::default(), drop)?;
        Ok(self.take_claimed())
    }

    /// [`Store::claim`]: the claim of `attempt` under `engine`'s rules, with no waiting.
    ///
    /// The machine's claim starts with a read and [`Engine::decide`] on it; that first step
    /// is made here. A replay, a mismatch or a refusal is then the whole answer
    /// ([`Request::decided`] answers those decisions as they are, with nothing to write or
    /// wait for), so no machine is built for them. Any other decision is handed to the
    /// machine as if it had read and decided itself, and it goes on from there.
    pub(crate) fn claim_attempt<S: Store + ?Sized>(
        store: &mut S,
        engine: &Engine,
        now: UnixMillis,
        attempt: &Attempt<'_>,
    ) -> Result<Claim, S::Error> {
        let decision = engine.decide(now, attempt, store.read(attempt.key)?.as_deref());
        if matches!(
            decision,
            Decision::Replay(_) | Decision::Mismatch { .. } | Decision::Rejected(_)
        ) {
            return Ok(Claim::Done(decision));
        }
        let mut request = Request::for_attempt(engine, attempt);
        let mut waiters = Waiters::default();
        // Under a record's rules nothing is decided before the read: the first step is it.
        if matches!(request.poll(now, &mut waiters), Step::Claim) {
            request.handle_decision(now, decision, &mut waiters);
        }
        request.drive_then(store, now, &mut waiters, drop)?;
        Ok(request.take_claim())
    }

    /// [`Request::claim_on`] for a record lease, as [`Store::claim`] answers it.
    pub(crate) fn claim_record_on<S: Store + ?Sized>(
        &mut self,
        store: &mut S,
        now: UnixMillis,
    ) -> Result<Claim, S::Error> {
        self.drive_then(store, now, &mut Waiters::default(), drop)?;
        Ok(self.take_claim())
    }

    /// What a claim driven to its end answers: the decision, or the lease.
    pub(super) fn take_claim(&mut self) -> Claim {
        match self.take_answer() {
            Some(d) => Claim::Done(d),
            None => self.take_claimed().into(),
        }
    }

    /// The decision of a request answered without a lease, moved out alone: the state
    /// around it is large.
    pub(super) fn take_answer(&mut self) -> Option<Decision> {
        match &mut self.state {
            State::Answered(Answer::Decision(d)) => {
                Some(core::mem::replace(d, Decision::CONTENDED))
            }
            _ => None,
        }
    }

    /// [`Request::claimed`], moving the lease or decision out.
    pub fn into_claimed(mut self) -> Claimed {
        self.take_claimed()
    }

    /// [`Request::claimed`], moving the lease or decision out and leaving the request
    /// finished, without moving the request itself.
    pub(super) fn take_claimed(&mut self) -> Claimed {
        if let Some(d) = self.take_answer() {
            return Claimed::Done(d);
        }
        match core::mem::replace(&mut self.state, State::Finished(Finish::FencedOut)) {
            State::Holding(h) => Claimed::Execute {
                hold: h.hold.into_hold(),
                recovered: h.recovered,
            },
            _ => Claimed::Done(Decision::CONTENDED),
        }
    }

    /// Records `outcome` over `store` for a request already holding its lease.
    pub(crate) fn finish_on<S: Store + ?Sized>(
        &mut self,
        store: &mut S,
        now: UnixMillis,
        outcome: Outcome,
    ) -> Result<Finish, S::Error> {
        self.handle_outcome(outcome);
        self.drive_then(store, now, &mut Waiters::default(), |step| match step {
            Step::Done(finish) => finish,
            _ => Finish::FencedOut,
        })
    }
}
