#!lua flags=allow-oom
-- idem: the compare-and-set of one record in Redis or Valkey (IDEM-STORE-1), as one script,
-- so that the check and the write are one step with nothing in between. Read by the
-- JavaScript RedisStore and by the Rust one; this file is the only copy.
--
-- Its first line lets it run when Redis is at `maxmemory` (Redis 7 and Valkey 7.2 read it):
-- a write to a record that exists (a completion, a heartbeat, a withdrawal) is never refused
-- for memory, or a handler that ran would leave its lease to expire and run again. A claim
-- of a new key is sent without that line, and Redis refuses it when full (IDEM-STORE-3).
--
-- A record is one hash: `v`, its version (decimal text), and `r`, its bytes. A record that
-- holds a response whose retention ends before the record's (a completed record) keeps the
-- response apart, in a second hash with the same fields under KEYS[2], which expires when the
-- response does (IDEM-STORE-9): `r` of the first then holds the record as it stands once its
-- response has expired (its tombstone, same version), and the response bytes are gone from
-- Redis at the response's expiry, not kept until the key's. Read with redis-load.lua.
--
-- KEYS[1]  the record's Redis key
-- KEYS[2]  the key of its response (the record's key and ':response', in the same slot)
-- ARGV[1]  the version the record must have, or '' when no record may exist
-- ARGV[2]  the version after the write, or '' to delete the record
-- ARGV[3]  the record's bytes (ignored for a delete): without its response when ARGV[5] is set
-- ARGV[4]  until when the record must be kept, in ms since the epoch: its key's expiry, or
--          its live lease's end if later. Never the response's expiry: a record deleted then
--          makes its key new again, and a retry would run again (IDEM-TTL-3).
-- ARGV[5]  the whole record, response included, when the response is kept apart, else ''
-- ARGV[6]  when the response expires, in ms since the epoch (ignored without ARGV[5])
--
-- Returns 1 when the write was made, 0 when the precondition failed (nothing changed). The
-- write of a new record that finds the record already as it would leave it (its version and
-- its bytes) was made: 1, so that a script sent again after its connection failed before the
-- answer came back (ioredis sends unanswered commands again once it reconnects) is its
-- writer's own claim, not another's. Only a new record's: its version is drawn at random by
-- its attempt, so no other attempt writes the same. A write to an existing record may be
-- another attempt's to the byte (two takeovers of one lease in the same millisecond), and
-- only one of them is made.
local current = redis.call('HGET', KEYS[1], 'v')
if ARGV[1] == '' then
  if current then
    if current == ARGV[2] and redis.call('HGET', KEYS[1], 'r') == ARGV[3] then return 1 end
    return 0
  end
elseif current ~= ARGV[1] then
  return 0
end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1], KEYS[2])
  return 1
end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'r', ARGV[3])
redis.call('PEXPIREAT', KEYS[1], ARGV[4])
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[2], 'v', ARGV[2], 'r', ARGV[5])
  redis.call('PEXPIREAT', KEYS[2], ARGV[6])
else
  redis.call('DEL', KEYS[2])
end
return 1
