//! What JavaScript reports back for a slot's step: the record it read, whether its write was
//! applied, a store that failed, a Durable Object's claim, the handler's outcome, a heartbeat
//! asked for.

use super::{stored_record, HeartbeatState, Host, Ran};
use crate::interop::{self, ErrorParts};
use alloc::vec::Vec;
use idem_core::{Applied, Inbox, Outcome, StoreFailure, StoredResponse, UnixMillis};

impl Host {
    /// The record read for a [`Claim`](idem_core::Step::Claim) or
    /// [`Load`](idem_core::Step::Load) step, as stored bytes (`None`: no record). `IDEM-REC-1`
    /// for bytes that are not a record; a sealed record that reaches the module unopened
    /// (its store has no seal, or not its key) is a store failure (`IDEM-SEAL-3`).
    pub fn record(
        &mut self,
        t: u32,
        now: UnixMillis,
        value: Option<&[u8]>,
    ) -> Result<(), ErrorParts> {
        if value.is_some_and(idem_core::seal::is_sealed) {
            return self.store_failed(t, StoreFailure::Sealed);
        }
        let record = stored_record(value)?;
        let (slot, waiters) = self.request(t)?;
        slot.req.handle_record(now, record.as_ref(), waiters);
        Ok(())
    }

    /// Whether the write of [`Step::Apply`](idem_core::Step::Apply) was applied.
    pub fn applied(&mut self, t: u32, now: UnixMillis, applied: bool) -> Result<(), ErrorParts> {
        let (slot, waiters) = self.request(t)?;
        let applied = if applied {
            Applied::Applied
        } else {
            Applied::Conflict
        };
        slot.req.handle_applied(now, applied, waiters);
        Ok(())
    }

    /// The store failed on the step handed out: full (`IDEM-STORE-3`) or not.
    pub fn store_failed(&mut self, t: u32, failure: StoreFailure) -> Result<(), ErrorParts> {
        let (slot, waiters) = self.request(t)?;
        slot.req.handle_store_error(failure, waiters);
        Ok(())
    }

    /// The store let go of the handler's uncommitted writes as the attempt ended.
    pub fn writes_dropped(&mut self, t: u32) -> Result<(), ErrorParts> {
        self.slot_mut(t)?.req.handle_writes_dropped();
        Ok(())
    }

    /// What a Durable Object claimed for a [`Claim`](idem_core::Step::Claim) step (`IDEM-JS-2`
    /// for bytes that are not a claim).
    pub fn claimed(&mut self, t: u32, now: UnixMillis, bytes: &[u8]) -> Result<(), ErrorParts> {
        let claimed = interop::decode_claimed(bytes)?;
        let (slot, waiters) = self.request(t)?;
        slot.req.handle_claimed(now, claimed, waiters);
        Ok(())
    }

    /// The handler's outcome: `status`, `headers` (a flat list text) and `body` when it
    /// answered.
    pub fn outcome(
        &mut self,
        t: u32,
        ran: Ran,
        status: u16,
        headers: &str,
        body: Vec<u8>,
    ) -> Result<(), ErrorParts> {
        if matches!(ran, Ran::Answered | Ran::Oversized) && !(100..=599).contains(&status) {
            return Err(ErrorParts::complete(
                &idem_core::CompleteError::InvalidStatus(status),
            ));
        }
        let outcome = match ran {
            Ran::Answered => Outcome::classify(StoredResponse {
                status,
                headers: interop::pairs(headers)?,
                body,
            }),
            Ran::Oversized => {
                self.slot_mut(t)?.req.handle_oversized(status);
                return Ok(());
            }
            Ran::Trailed => {
                self.slot_mut(t)?.req.handle_with_trailers(status);
                return Ok(());
            }
            Ran::Threw => Outcome::Unknown(None),
            Ran::NothingHappened => Outcome::Retryable,
            Ran::Processed => Inbox::processed(),
        };
        self.slot_mut(t)?.req.handle_outcome(outcome);
        Ok(())
    }

    /// Asks for a heartbeat; the next poll hands out its write. [`HeartbeatState::Quiet`]
    /// when it is on its way, otherwise why it is refused: the lease has ended, or was lost,
    /// or the outcome is in.
    pub fn heartbeat(&mut self, t: u32, now: UnixMillis) -> Result<HeartbeatState, ErrorParts> {
        Ok(match self.slot_mut(t)?.req.heartbeat(now) {
            Ok(()) => HeartbeatState::Quiet,
            Err(h) => HeartbeatState::of(h),
        })
    }
}
