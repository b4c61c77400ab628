//! The operations a host serves beside the guarded request, each opened in a slot and driven
//! like any request: issuing a token, opening a counter session, delivering a message to an
//! inbox, answering a status query.

use super::Host;
use crate::interop::{self, ErrorParts};
use idem_core::{Delivery, Inbox, Message, Refusal, Request, StatusQuery, Target, UnixMillis};

impl Host {
    /// Opens a slot for the operation that issues a token for `principal`'s requests with
    /// `method` to `route` (`IDEM-TOKEN-1`): driven like any request, it answers 201 with the
    /// token (or 500 when the keys are not tokens).
    pub fn issue_token(
        &mut self,
        principal: Option<&str>,
        method: &str,
        route: &str,
        now: UnixMillis,
        random: [u64; 2],
    ) -> u32 {
        let target = Target {
            principal,
            method,
            route,
        };
        let req = self.policy.issue_token(&target, now, random);
        self.open(req)
    }

    /// Opens a slot for the operation that opens (or moves to a new epoch) the counter
    /// session of `client` for `principal`'s requests with `method` to `route`, its first
    /// sequence number `first_seq` (decimal text): driven like any request, it answers 201
    /// with the session, or the core's refusal (`IDEM-CTR-1` for a first number that is not
    /// one).
    #[allow(clippy::too_many_arguments)]
    pub fn open_session(
        &mut self,
        principal: Option<&str>,
        method: &str,
        route: &str,
        client: &str,
        first_seq: &str,
        nonce: u64,
    ) -> u32 {
        let target = Target {
            principal,
            method,
            route,
        };
        let req = match interop::decimal("the first sequence number", first_seq) {
            Ok(first) => self.policy.open_session(&target, client, first, nonce),
            Err(_) => Request::refused(Refusal {
                requirement: "IDEM-CTR-1",
                ..Refusal::new(
                    idem_core::Problem::MALFORMED_KEY,
                    "the first sequence number must be a whole number",
                )
            }),
        };
        self.open(req)
    }

    /// Opens a slot for the session operation from the body of a session endpoint
    /// (`{"client": "…", "firstSeq": n}`).
    pub fn open_session_from(
        &mut self,
        principal: Option<&str>,
        method: &str,
        route: &str,
        body: &[u8],
        nonce: u64,
    ) -> u32 {
        let target = Target {
            principal,
            method,
            route,
        };
        let req = self.policy.open_session_from(&target, body, nonce);
        self.open(req)
    }

    /// Opens a slot for one delivery of a message to the inbox of this policy's engine and
    /// fingerprint (`IDEM-INBOX-1`): driven like any request, its handler is the processing.
    pub fn deliver(&mut self, message: &Message<'_>, nonce: u64) -> u32 {
        let inbox = Inbox::new(self.policy.engine().clone())
            .with_fingerprint(self.policy.fingerprint_spec().clone());
        let req = inbox.deliver(message, nonce);
        self.open(req)
    }

    /// Opens a slot for a status query (`IDEM-STATUS-1`): what became of the key in the key
    /// header value `key` of `principal`'s requests to `route`, with the `Idempotency-Status`
    /// field `field` naming their method (and `settle`), and `client` the client of a
    /// unix-time key that names none. Driven like any request, it answers with the status
    /// document, or the core's refusal.
    #[allow(clippy::too_many_arguments)]
    pub fn status(
        &mut self,
        principal: Option<&str>,
        route: &str,
        key: Option<&str>,
        field: &str,
        client: Option<&str>,
        nonce: u64,
    ) -> u32 {
        let keys: &[&[u8]] = match key {
            Some(k) => &[k.as_bytes()],
            None => &[],
        };
        let query = StatusQuery {
            principal,
            route,
            keys,
            status: field.as_bytes(),
            client,
        };
        let req = self.policy.status(&query, nonce);
        self.open(req)
    }

    /// What became of the delivery in slot `t`, once it is over.
    pub fn delivery(&self, t: u32) -> Result<Option<Delivery>, ErrorParts> {
        Ok(self.slot(t)?.req.delivery())
    }
}
