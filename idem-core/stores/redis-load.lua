-- idem: the read of one record in Redis or Valkey, as one script, so that a record and its
-- response (see redis-apply.lua) are read as one step. Read by the JavaScript RedisStore and
-- by the Rust one; this file is the only copy.
--
-- KEYS[1]  the record's Redis key
-- KEYS[2]  the key of its response
--
-- Returns nil when there is no record, else its version and its bytes: the whole record
-- while its response is kept, the record without it (its tombstone) once the response has
-- expired.
local record = redis.call('HMGET', KEYS[1], 'v', 'r')
if not record[1] or not record[2] then return false end
local response = redis.call('HMGET', KEYS[2], 'v', 'r')
if response[1] == record[1] and response[2] then
  return {record[1], response[2]}
end
return record
