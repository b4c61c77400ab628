//! What JavaScript reads from a slot: the write of an `Apply` step, the bytes a Durable Object
//! exchanges, the events, the handler's context, and the reply and context bytes it reads in
//! place from the host's buffer.

use super::{no_slot, numbered, HeartbeatState, Host};
use crate::interop::{self, ErrorParts, StoreWrite};
use alloc::string::String;
use alloc::vec::Vec;
use idem_core::{Event, Refusal, UnixMillis};

impl Host {
    /// The write of the last [`Apply`](idem_core::Step::Apply) step, as the store interface
    /// takes it.
    pub fn take_write(&mut self, t: u32) -> Result<StoreWrite, ErrorParts> {
        let slot = self.slot_mut(t)?;
        let stores_response = slot
            .req
            .completing()
            .is_some_and(|c| c.finish == idem_core::Finish::Stored);
        slot.write
            .take()
            .map(|w| StoreWrite {
                stores_response,
                ..StoreWrite::from_core(&w)
            })
            .ok_or_else(no_slot)
    }

    /// What a Durable Object sends back after the claim of a resumed slot.
    pub fn claimed_bytes(&self, t: u32) -> Result<Vec<u8>, ErrorParts> {
        let claimed = self.slot(t)?.req.claimed().ok_or_else(no_slot)?;
        Ok(interop::encode_claimed(&claimed))
    }

    /// The ticket a Durable Object needs to claim for this request, with `nonce`
    /// ([`idem_core::Request::claim_ticket`]).
    pub fn ticket(&mut self, t: u32, nonce: u64) -> Result<Vec<u8>, ErrorParts> {
        let ticket = self.slot_mut(t)?.req.claim_ticket(nonce);
        Ok(interop::encode_ticket(&ticket))
    }

    /// Where the heartbeats stand.
    pub fn heartbeat_state(&self, t: u32) -> Result<HeartbeatState, ErrorParts> {
        Ok(HeartbeatState::of(self.slot(t)?.req.heartbeat_state()))
    }

    /// The next event, if any.
    pub fn poll_event(&mut self, t: u32) -> Result<Option<Event>, ErrorParts> {
        Ok(self.slot_mut(t)?.req.poll_event())
    }

    /// The handler's context while it runs: whether it recovers, the fence, and when the
    /// lease ends.
    pub fn context(&self, t: u32) -> Result<idem_core::Context, ErrorParts> {
        self.slot(t)?.req.context().ok_or_else(no_slot)
    }

    /// When the last [`Step::WaitUntil`](idem_core::Step::WaitUntil) asked to be polled again.
    pub fn wait_until(&self, t: u32) -> Result<UnixMillis, ErrorParts> {
        Ok(self.slot(t)?.wait_until)
    }

    /// What the last [`Step::Done`](idem_core::Step::Done) said.
    pub fn done(&self, t: u32) -> Result<Option<idem_core::Finish>, ErrorParts> {
        Ok(self.slot(t)?.done.clone())
    }

    /// The key the store keeps the record under
    /// ([`RecordKey::storage_key`](idem_core::RecordKey::storage_key)).
    pub fn storage_key(&self, t: u32) -> Result<String, ErrorParts> {
        Ok(self.slot(t)?.req.key().storage_key())
    }

    /// The idempotency key as parsed (a UUID in lowercase).
    pub fn key(&self, t: u32) -> Result<&str, ErrorParts> {
        Ok(&self.slot(t)?.req.key().key)
    }

    /// The record's digest for telemetry
    /// ([`RecordKey::digest`](idem_core::RecordKey::digest)), or none for a request refused
    /// before it had a key.
    pub fn key_digest(&self, t: u32) -> Result<Option<String>, ErrorParts> {
        let key = self.slot(t)?.req.key();
        Ok((!key.key.is_empty()).then(|| key.digest()))
    }

    /// The index of the slot's operation in
    /// [`telemetry::OPERATIONS`](idem_core::telemetry::OPERATIONS).
    pub fn operation_index(&self, t: u32) -> Result<u32, ErrorParts> {
        let operation = self.slot(t)?.req.operation();
        Ok(idem_core::telemetry::OPERATIONS
            .iter()
            .position(|o| *o == operation)
            .unwrap_or(0) as u32)
    }

    /// The telemetry's `error.type` for the slot's answer with `status`
    /// ([`telemetry::error_type`](idem_core::telemetry::error_type)).
    pub fn error_type(&self, t: u32, status: u16) -> Result<Option<String>, ErrorParts> {
        // The refusal or decision that answered, not the rendered reply: its problem type is
        // all this needs.
        let req = &self.slot(t)?.req;
        let problem = match req.refusal() {
            Some(r) => Some(r.problem.type_uri),
            None => req
                .decision()
                .and_then(Refusal::of_decision)
                .map(|r| r.problem.type_uri),
        };
        Ok(idem_core::telemetry::error_type(status, problem))
    }

    /// The requirement of the refusal that answered the request, if one did.
    pub fn refusal(&self, t: u32) -> Result<Option<&Refusal>, ErrorParts> {
        Ok(self.slot(t)?.req.refusal())
    }

    /// The reply bytes of a request answered without its handler (a
    /// [`Reply`](idem_core::Step::Reply) step), written into a buffer the host keeps (at
    /// [`Host::out_ptr`], valid until the next call), so that JavaScript reads them in place
    /// instead of receiving a copy. Empty when there is none.
    pub fn reply(&mut self, t: u32) -> &[u8] {
        let out = &mut self.out;
        out.clear();
        if let Some(reply) = self
            .slots
            .get(t as usize)
            .and_then(Option::as_ref)
            .and_then(|s| s.req.reply())
        {
            interop::encode_reply_into(out, &reply);
        }
        out
    }

    /// The running handler's context and key as context bytes (see [`interop`]), where
    /// [`Host::reply`] writes, so that JavaScript reads them in one call.
    pub fn context_out(&mut self, t: u32) -> Result<&[u8], ErrorParts> {
        let Host { slots, out, .. } = self;
        let req = &numbered(slots, t)?.req;
        let context = req.context().ok_or_else(no_slot)?;
        interop::encode_context_into(out, &context, &req.key().key);
        Ok(out)
    }

    /// `write` as write bytes (see [`interop`]), where [`Host::reply`] writes, so that
    /// JavaScript reads them in place.
    pub fn write_out(&mut self, write: &StoreWrite) -> &[u8] {
        write.encode_into(&mut self.out);
        &self.out
    }

    /// Where the last [`Host::reply`] was written (an address in the module's memory).
    pub fn out_ptr(&self) -> usize {
        self.out.as_ptr() as usize
    }
}
