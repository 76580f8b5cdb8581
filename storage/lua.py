"""Lua scripts for the job store's state transitions: each runs atomically inside Redis.

Every script takes the job's hash as KEYS[1] and the namespace as ARGV[1]. Key names come from
`storage.redis_keys.RedisKeys` (the only place they are spelled), turned into Lua expressions below. The index keys
(a tenant's per-state sets, the queued set, the lease set) are derived from the namespace and
the tenant read from the hash, so the store needs one Redis instance, not a cluster.

Keys, with ns the namespace:
    {ns}:job:{job_id}                 hash, the record (see job_record.py)
    {ns}:tenant-jobs:{state}:{tenant} sorted set, job ids by created_at; state "all" holds every job
    {ns}:queued                       sorted set, queued job ids by the time they were (re)queued
    {ns}:queued:{queue}:{priority}    sorted set, the same for one model's queue and one priority, by
                                      fair-share tag: the order workers take them in (storage.fair_share),
                                      so a job's rank is its queue position
    {ns}:fair:{queue}:{priority}      hash, that order's virtual clock ("clock", the tag taken last) and
                                      each tenant's next tag ("tenant:NAME")
    {ns}:leases                       sorted set, running job ids by lease expiry
    {ns}:wake:{queue}                 list, wake-up tokens for the workers of one model's queue: one is
                                      pushed whenever a job is queued there (at most WAKE_TOKENS kept);
                                      an idle worker blocks on it (worker.feeder)
    {ns}:finished-counts              hash, terminal state -> jobs that ever reached it
    {ns}:idem:{tenant}:{key}          hash, job_id and request_hash of an idempotent create
    {ns}:job-events:{job_id}          stream, the job's events (storage.job_events); each entry is also
                                      announced on the pub/sub channel {ns}:job-events (message: job_id)
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import cast

from core.params import PRIORITIES
from storage.job_events import EVENT_LOG_MAX_ENTRIES, EVENT_LOG_SECONDS, EVENT_LOG_SECONDS_AFTER_END
from storage.job_record import JobState
from storage.redis_keys import RedisKeys

# Key names are spelled once, in RedisKeys: the scripts get them as Lua expressions over their `ns`, built by
# asking RedisKeys for a key whose variable parts are placeholders and putting the Lua variables in their place.
_PLACEHOLDERS = {"\x01": "ns", "\x02": "tenant", "\x03": "state", "\x04": "queue", "\x05": "priority"}
_KEYS = RedisKeys("\x01")
_STATE_PLACEHOLDER = cast(JobState, SimpleNamespace(value="\x03"))  # tenant_index reads only .value


def _lua_expression(key: str) -> str:
    """`key` with placeholders, as a Lua concatenation of string literals and the variables they stand for."""
    parts = [part for part in re.split("([\x01-\x05])", key) if part]
    return " .. ".join(_PLACEHOLDERS.get(part) or "'" + part.replace("'", "\\'") + "'" for part in parts)


WAKE_TOKENS = 64  # wake-up tokens kept per queue: enough to wake every idle worker of a model at once

_KEY_NAMES = f"""
local queued_key = {_lua_expression(_KEYS.queued)}
local leases_key = {_lua_expression(_KEYS.leases)}

local function wake_workers(queue)
  local key = {_lua_expression(_KEYS.wake(chr(4)))}
  redis.call('LPUSH', key, '1')
  redis.call('LTRIM', key, 0, {WAKE_TOKENS - 1})
end
local finished_counts_key = {_lua_expression(_KEYS.finished_counts)}

local function job_key_of(job_id)
  return {_lua_expression(_KEYS.job(""))} .. job_id
end

local events_channel = {_lua_expression(_KEYS.job_events_channel)}

local function events_key_of(job_id)
  return {_lua_expression(_KEYS.job_events(""))} .. job_id
end

-- One entry (field, value, ...) on the job's event stream, announced to the API's listeners.
local function emit(job_id, ...)
  local key = events_key_of(job_id)
  redis.call('XADD', key, 'MAXLEN', '~', {EVENT_LOG_MAX_ENTRIES}, '*', ...)
  redis.call('EXPIRE', key, {EVENT_LOG_SECONDS})
  redis.call('PUBLISH', events_channel, job_id)
end

-- The end state: the last entry, and the only one kept (a resumed stream needs nothing before it).
local function emit_end(job_id, state)
  emit(job_id, 'event', state)
  local key = events_key_of(job_id)
  redis.call('XTRIM', key, 'MAXLEN', 1)
  redis.call('EXPIRE', key, {EVENT_LOG_SECONDS_AFTER_END})
end

local function deleted_key_of(job_id)
  return {_lua_expression(_KEYS.deleted(""))} .. job_id
end
"""


_PREAMBLE = (
    """
local ns = ARGV[1]
"""
    + _KEY_NAMES
    + """

local function tenant_index(state, tenant)
  return """
    + _lua_expression(_KEYS.tenant_index("\x02", _STATE_PLACEHOLDER))
    + """
end

local function queued_index_of(queue, priority)
  return """
    + _lua_expression(_KEYS.queued_in("\x04", "\x05"))
    + """
end

local function fair_clock_of(queue, priority)
  return """
    + _lua_expression(_KEYS.fair_clock("\x04", "\x05"))
    + """
end

local function exact(x)
  return string.format('%.17g', x)
end

-- The job's queue index, the fair clock of that queue and priority, and its tenant.
local function fair_keys(job_key)
  local queue, priority, tenant = unpack(redis.call('HMGET', job_key, 'queue', 'priority', 'tenant'))
  return queued_index_of(queue, priority), fair_clock_of(queue, priority), tenant
end

local function hash_number(key, field)
  return tonumber(redis.call('HGET', key, field) or '0') or 0
end

-- A new job gets the tag max(clock, its tenant's next tag), which then moves on by the job's share.
local function add_new_queued(job_key, job_id, queued_at, share)
  redis.call('ZADD', queued_key, queued_at, job_id)
  local index, fair, tenant = fair_keys(job_key)
  local tag = math.max(hash_number(fair, 'clock'), hash_number(fair, 'tenant:' .. tenant))
  redis.call('HSET', fair, 'tenant:' .. tenant, exact(tag + share))
  redis.call('HSET', job_key, 'queue_tag', exact(tag), 'queue_share', exact(share))
  redis.call('ZADD', index, exact(tag), job_id)
end

-- A job back in the queue goes ahead of every job not taken yet: those have tags at or after the clock,
-- and its tag (taken already) is at or before it, so its tag less its share is before them all.
local function add_requeued(job_key, job_id, queued_at)
  redis.call('ZADD', queued_key, queued_at, job_id)
  local index, fair = fair_keys(job_key)
  local tag, share = unpack(redis.call('HMGET', job_key, 'queue_tag', 'queue_share'))
  tag = tonumber(tag or '') or hash_number(fair, 'clock')
  redis.call('ZADD', index, exact(tag - (tonumber(share or '') or 1)), job_id)
end

-- The clock follows the tags of the jobs taken.
local function advance_clock(job_key)
  local _, fair = fair_keys(job_key)
  local tag = tonumber(redis.call('HGET', job_key, 'queue_tag') or '')
  if tag and tag > hash_number(fair, 'clock') then
    redis.call('HSET', fair, 'clock', exact(tag))
  end
end

-- A job that leaves the queue without ever running gives its tenant its share back.
local function refund_share(job_key)
  local _, fair, tenant = fair_keys(job_key)
  local share, attempts = unpack(redis.call('HMGET', job_key, 'queue_share', 'attempts'))
  if not share or (tonumber(attempts or '0') or 0) > 0 then
    return
  end
  local next_tag = hash_number(fair, 'tenant:' .. tenant) - tonumber(share)
  redis.call('HSET', fair, 'tenant:' .. tenant, exact(math.max(hash_number(fair, 'clock'), next_tag)))
end

local function remove_queued(job_key, job_id)
  redis.call('ZREM', queued_key, job_id)
  redis.call('ZREM', (fair_keys(job_key)), job_id)
end

local function set_state(job_key, job_id, from_state, to_state)
  local tenant, created_at = unpack(redis.call('HMGET', job_key, 'tenant', 'created_at'))
  redis.call('ZREM', tenant_index(from_state, tenant), job_id)
  redis.call('ZADD', tenant_index(to_state, tenant), created_at, job_id)
  redis.call('HSET', job_key, 'state', to_state)
end

-- Out of the queue and the lease set, counted, and kept only for ttl seconds from now on.
local function finish_job(job_key, job_id, from_state, to_state, now, ttl)
  if from_state == 'queued' then
    refund_share(job_key)
  end
  set_state(job_key, job_id, from_state, to_state)
  redis.call('HSET', job_key, 'finished_at', now)
  redis.call('HDEL', job_key, 'lease_expires_at')
  remove_queued(job_key, job_id)
  redis.call('ZREM', leases_key, job_id)
  redis.call('HINCRBY', finished_counts_key, to_state, 1)
  redis.call('EXPIRE', job_key, ttl)
  local idem_key = redis.call('HGET', job_key, 'idem_redis_key')
  if idem_key then
    redis.call('EXPIRE', idem_key, ttl)
  end
  emit_end(job_id, to_state)
end

-- Queued -> running with a lease. started_at is the first start (a re-queued job keeps it); queued_seconds
-- adds the time since the job was (re)queued, so the run time of an earlier attempt never counts as waiting.
local function take_job(job_key, job_id, worker_id, now, lease_expires_at)
  local created_at, requeued_at, queued_seconds = unpack(redis.call(
    'HMGET', job_key, 'created_at', 'requeued_at', 'queued_seconds'))
  local waited = (tonumber(queued_seconds) or 0) + math.max(0, tonumber(now) - tonumber(requeued_at or created_at))
  set_state(job_key, job_id, 'queued', 'running')
  redis.call('HSETNX', job_key, 'started_at', now)
  redis.call('HSET', job_key, 'worker_id', worker_id, 'lease_expires_at', lease_expires_at, 'progress_step', '0',
             'queued_seconds', exact(waited))
  redis.call('HINCRBY', job_key, 'attempts', 1)
  advance_clock(job_key)
  remove_queued(job_key, job_id)
  redis.call('ZADD', leases_key, lease_expires_at, job_id)
  emit(job_id, 'event', 'started')
end
"""
)

# KEYS: job, [idempotency]. ARGV: ns, job_id, request_hash, max_queued (0: no limit), the record's hash as a
# JSON list [field, value, ...] (one argument instead of forty: the client packs far less), the job's share in
# the fair order (cost / weight), the uploads' TTL in seconds, then (upload key, data URI) pairs: the job's
# inline input images, stored only when the job is created.
# Returns {1, position in its queue and priority} when created, {0, stored_request_hash, HGETALL of
# the earlier job} for an idempotent replay, or {2, number queued} when max_queued jobs are queued.
# A created job wakes its queue's workers in the same step (worker.feeder).
CREATE = (
    _PREAMBLE
    + """
local job_id = ARGV[2]
local max_queued = tonumber(ARGV[4])
if KEYS[2] then
  local held = redis.call('HMGET', KEYS[2], 'job_id', 'request_hash')
  if held[1] and redis.call('EXISTS', job_key_of(held[1])) == 1 then
    return {0, held[2], redis.call('HGETALL', job_key_of(held[1]))}
  end
end
if max_queued > 0 then
  local num_queued = redis.call('ZCARD', queued_key)
  if num_queued >= max_queued then
    return {2, num_queued}
  end
end
if KEYS[2] then
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[2], 'job_id', job_id, 'request_hash', ARGV[3])
end
for i = 8, #ARGV, 2 do
  redis.call('SET', ARGV[i], ARGV[i + 1], 'EX', tonumber(ARGV[7]))
end
redis.call('HSET', KEYS[1], unpack(cjson.decode(ARGV[5])))
if KEYS[2] then
  redis.call('HSET', KEYS[1], 'idem_redis_key', KEYS[2])
end
local tenant, created_at = unpack(redis.call('HMGET', KEYS[1], 'tenant', 'created_at'))
redis.call('ZADD', tenant_index('all', tenant), created_at, job_id)
redis.call('ZADD', tenant_index('queued', tenant), created_at, job_id)
add_new_queued(KEYS[1], job_id, created_at, tonumber(ARGV[6]))
wake_workers(redis.call('HGET', KEYS[1], 'queue'))
return {1, redis.call('ZRANK', (fair_keys(KEYS[1])), job_id)}
"""
)

# ARGV: ns, job_id, worker_id, now, lease_expires_at. Returns HGETALL, or false if not queued.
# started_at is the first start (a re-queued job keeps it); queued_seconds adds the time since the
# job was (re)queued, so the run time of an earlier attempt never counts as waiting.
# Taking one job by its id, without a message (tests, tools): its owed message, if any, is forgiven.
TAKE = (
    _PREAMBLE
    + """
if redis.call('HGET', KEYS[1], 'state') ~= 'queued' then
  return false
end
take_job(KEYS[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
return redis.call('HGETALL', KEYS[1])
"""
)

# ARGV: ns, queue, worker_id, now, lease_expires_at. What a generate message does: take the queue's next
# job, highest priority first and within one priority the smallest fair-share tag. Returns HGETALL, or
# false when nothing of that queue is queued. An index entry whose record is not queued (none should
# exist) is dropped on the way.
TAKE_NEXT = (
    _PREAMBLE
    + """
local queue = ARGV[2]
for _, priority in ipairs({"""
    + ", ".join(f"'{name}'" for name in PRIORITIES)
    + """}) do
  local index = queued_index_of(queue, priority)
  while true do
    local head = redis.call('ZRANGE', index, 0, 0)[1]
    if not head then
      break
    end
    local job_key = job_key_of(head)
    if redis.call('HGET', job_key, 'state') == 'queued' then
      take_job(job_key, head, ARGV[3], ARGV[4], ARGV[5])
      return redis.call('HGETALL', job_key)
    end
    redis.call('ZREM', index, head)
  end
end
return false
"""
)

# ARGV: ns, job_id, worker_id, lease_expires_at. Returns 1 if renewed.
RENEW_LEASE = (
    _PREAMBLE
    + """
local state, holder = unpack(redis.call('HMGET', KEYS[1], 'state', 'worker_id'))
if state ~= 'running' or holder ~= ARGV[3] then
  return 0
end
redis.call('HSET', KEYS[1], 'lease_expires_at', ARGV[4])
redis.call('ZADD', leases_key, ARGV[4], ARGV[2])
return 1
"""
)

# ARGV: ns, job_id, step, total, is_paused ('1'/'0'), is_late ('1'/'0'), current_image. Only a running job's
# progress moves (never recreates an expired hash).
SET_PROGRESS = (
    _PREAMBLE
    + """
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then
  return 0
end
redis.call('HSET', KEYS[1], 'progress_step', ARGV[3], 'progress_total', ARGV[4], 'is_paused', ARGV[5],
           'is_late', ARGV[6], 'progress_current_image', ARGV[7])
emit(ARGV[2], 'event', 'progress', 'step', ARGV[3], 'total', ARGV[4], 'current_image', ARGV[7])
return 1
"""
)

# ARGV: ns, job_id, step, total, image (a data URI). A running job's preview: only on its event stream.
ADD_PREVIEW = (
    _PREAMBLE
    + """
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then
  return 0
end
emit(ARGV[2], 'event', 'preview', 'step', ARGV[3], 'total', ARGV[4], 'image', ARGV[5])
return 1
"""
)

# ARGV: ns, job_id, worker_id, now, reason. A running job this worker holds waits for its images to be stored
# (worker.spool): since when (the first time) and why (the latest error). Returns 1, or 0 if not held.
SET_STORING = (
    _PREAMBLE
    + """
local state, holder = unpack(redis.call('HMGET', KEYS[1], 'state', 'worker_id'))
if state ~= 'running' or holder ~= ARGV[3] then
  return 0
end
redis.call('HSETNX', KEYS[1], 'storing_since', ARGV[4])
redis.call('HSET', KEYS[1], 'storing_reason', ARGV[5])
emit(ARGV[2], 'event', 'storing', 'reason', ARGV[5])
return 1
"""
)

# ARGV: ns, job_id, from_worker_id, worker_id, now, lease_expires_at. A dead worker's spooled job: running under
# from_worker_id -> under worker_id; queued (re-queued meanwhile) -> taken. Returns HGETALL, or false.
ADOPT = (
    _PREAMBLE
    + """
local state, holder = unpack(redis.call('HMGET', KEYS[1], 'state', 'worker_id'))
if state == 'queued' then
  take_job(KEYS[1], ARGV[2], ARGV[4], ARGV[5], ARGV[6])
  return redis.call('HGETALL', KEYS[1])
end
if state ~= 'running' or holder ~= ARGV[3] then
  return false
end
redis.call('HSET', KEYS[1], 'worker_id', ARGV[4], 'lease_expires_at', ARGV[6])
redis.call('ZADD', leases_key, ARGV[6], ARGV[2])
return redis.call('HGETALL', KEYS[1])
"""
)

# ARGV: ns, job_id, to_state, now, ttl, worker_id or '', num_set, field, value, ..., field_to_delete, ...
# Returns 1 if the job moved to to_state.
FINISH = (
    _PREAMBLE
    + """
local state, holder = unpack(redis.call('HMGET', KEYS[1], 'state', 'worker_id'))
if state ~= 'queued' and state ~= 'running' then
  return 0
end
if ARGV[6] ~= '' and (state ~= 'running' or holder ~= ARGV[6]) then
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
# 'flagged' (running; the worker stops it), 'refused' (terminal) or 'missing'.
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
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
  return {'flagged', 'running'}
end
return {'refused', state}
"""
)

# ARGV: ns, job_id, worker_id or '', now, ttl, lapsed_at or '', reason code, reason message.
# Returns 1 if queued again (its queue's workers woken), 2 if canceled instead (a cancel was requested), 0 if
# refused.
RELEASE = (
    _PREAMBLE
    + """
local state, holder, lease, cancel = unpack(redis.call(
  'HMGET', KEYS[1], 'state', 'worker_id', 'lease_expires_at', 'cancel_requested'))
if state ~= 'running' then
  return 0
end
if ARGV[3] ~= '' and holder ~= ARGV[3] then
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
