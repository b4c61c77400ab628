-- idem: the compare-and-set of one record in Redis or Valkey (IDEM-STORE-1), as one script,
-- so that the check and the write are one step with nothing in between. Read by the
-- JavaScript RedisStore and by the Rust one; this file is the only copy.
--
-- A record is one hash: `v`, its version (decimal text), and `r`, its bytes.
--
-- KEYS[1]  the record's Redis key
-- ARGV[1]  the version the record must have, or '' when no record may exist
-- ARGV[2]  the version after the write, or '' to delete the record
-- ARGV[3]  the record's bytes (ignored for a delete)
-- ARGV[4]  until when the record must be kept, in ms since the epoch: its key's expiry, or
--          its live lease's end if later. Never the response's expiry: a record deleted then
--          makes its key new again, and a retry would run again (IDEM-TTL-3).
--
-- Returns 1 when the write was made, 0 when the precondition failed (nothing changed).
local current = redis.call('HGET', KEYS[1], 'v')
if ARGV[1] == '' then
  if current then return 0 end
elseif current ~= ARGV[1] then
  return 0
end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
  return 1
end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'r', ARGV[3])
redis.call('PEXPIREAT', KEYS[1], ARGV[4])
return 1
