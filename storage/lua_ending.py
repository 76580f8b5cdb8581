"""Lua scripts that end a job or take it back: finish, cancel, re-queue, delete, and a webhook's delivery
attempts. Key names and helpers: `storage.lua_preamble`."""

from __future__ import annotations

from storage.job_record import JobState
from storage.lua_preamble import PREAMBLE as _PREAMBLE

# ARGV: ns, job_id, to_state, now, ttl, holder or '', num_set, field, value, ..., field_to_delete, ...
# Returns 1 if the job moved to to_state.
FINISH = (
    _PREAMBLE
    + """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'queued' and state ~= 'running' then
  return 0
end
if ARGV[6] ~= '' and holder_of(KEYS[1]) ~= ARGV[6] then
  return 0
end
local num_set = tonumber(ARGV[7])
if num_set > 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 8, 7 + num_set))
end
for i = 8 + num_set, #ARGV do
  redis.call('HDEL', KEYS[1], ARGV[i])
end
finish_job(KEYS[1], ARGV[2], state, ARGV[3], ARGV[4], ARGV[5])
return 1
"""
)

# ARGV: ns, job_id, now, ttl. Returns {outcome, state}: outcome is 'canceled' (was queued),
# 'flagged' (running; the worker stops it), 'storing' (running, its images made and waiting in its worker's
# spool: nothing is left to stop, it succeeds once they are stored), 'refused' (terminal) or 'missing'.
REQUEST_CANCEL = (
    _PREAMBLE
    + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return {'missing', ''}
end
if state == 'queued' then
  finish_job(KEYS[1], ARGV[2], 'queued', 'canceled', ARGV[3], ARGV[4])
  return {'canceled', 'canceled'}
end
if state == 'running' then
  if redis.call('HEXISTS', KEYS[1], 'storing_since') == 1 then
    return {'storing', 'running'}
  end
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
  return {'flagged', 'running'}
end
return {'refused', state}
"""
)

# ARGV: ns, job_id, holder or '', now, ttl, lapsed_at or '', reason code, reason message.
# Returns 1 if queued again (its queue's workers woken), 2 if canceled instead (a cancel was requested), 0 if
# refused.
RELEASE = (
    _PREAMBLE
    + """
local state, lease, cancel = unpack(redis.call('HMGET', KEYS[1], 'state', 'lease_expires_at', 'cancel_requested'))
if state ~= 'running' then
  return 0
end
if ARGV[3] ~= '' and holder_of(KEYS[1]) ~= ARGV[3] then
  return 0
end
if ARGV[6] ~= '' and lease and tonumber(lease) > tonumber(ARGV[6]) then
  return 0
end
if cancel == '1' then
  finish_job(KEYS[1], ARGV[2], 'running', 'canceled', ARGV[4], ARGV[5])
  return 2
end
set_state(KEYS[1], ARGV[2], 'running', 'queued')
redis.call('HDEL', KEYS[1], 'worker_id', 'lease_expires_at', 'is_paused', 'storing_since', 'storing_reason')
redis.call('HSET', KEYS[1], 'progress_step', '0', 'requeued_at', ARGV[4], 'requeue_reason', ARGV[7],
           'requeue_message', ARGV[8])
redis.call('ZREM', leases_key, ARGV[2])
add_requeued(KEYS[1], ARGV[2], ARGV[4])
wake_workers(redis.call('HGET', KEYS[1], 'queue'))
emit(ARGV[2], 'event', 'queued')
return 1
"""
)

# ARGV: ns, attempt as a JSON object. Appends to the JSON list without decoding it.
ADD_WEBHOOK_ATTEMPT = (
    _PREAMBLE
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local attempts = redis.call('HGET', KEYS[1], 'webhook_attempts')
if not attempts or attempts == '[]' then
  attempts = '[' .. ARGV[2] .. ']'
else
  attempts = string.sub(attempts, 1, -2) .. ',' .. ARGV[2] .. ']'
end
redis.call('HSET', KEYS[1], 'webhook_attempts', attempts)
return 1
"""
)

# ARGV: ns, job_id, now, ttl, tombstone seconds. Removes the job's record from Redis: a queued job is
# canceled first (counted so), a running one is left to stop (its worker sees the record gone and
# cleans up its images, told by the tombstone). Returns {outcome, state before}: 'deleted' or 'missing'.
DELETE = (
    _PREAMBLE
    + """
local state, tenant = unpack(redis.call('HMGET', KEYS[1], 'state', 'tenant'))
if not state then
  return {'missing', ''}
end
if state == 'queued' then
  finish_job(KEYS[1], ARGV[2], 'queued', 'canceled', ARGV[3], ARGV[4])
end
remove_queued(KEYS[1], ARGV[2])
redis.call('ZREM', leases_key, ARGV[2])
for _, name in ipairs({'all', """
    + ", ".join(f"'{state.value}'" for state in JobState)
    + """}) do
  redis.call('ZREM', tenant_index(name, tenant), ARGV[2])
end
local idem_key = redis.call('HGET', KEYS[1], 'idem_redis_key')
if idem_key then
  redis.call('DEL', idem_key)
end
redis.call('DEL', KEYS[1])
redis.call('SET', deleted_key_of(ARGV[2]), state, 'EX', tonumber(ARGV[5]))
redis.call('PUBLISH', events_channel, ARGV[2])  -- its waiters and streams read the record again: gone
return {'deleted', state}
"""
)
