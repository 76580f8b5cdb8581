"""What every Lua script of the job store (storage.lua, lua_running, lua_ending) shares: key names, helpers, preamble.

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

from storage.job_events import EVENT_LOG_MAX_ENTRIES, EVENT_LOG_SECONDS, EVENT_LOG_SECONDS_AFTER_END
from storage.job_record import HOLDER_SEPARATOR, JobState
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

-- The lease holder of the running attempt, worker_id#attempts (storage.job_record.holder_token), or nil if no
-- worker holds the job: what every write of a holder is checked against, so a stale attempt writes nothing.
local function holder_of(job_key)
  local state, worker_id, attempts = unpack(redis.call('HMGET', job_key, 'state', 'worker_id', 'attempts'))
  if state ~= 'running' or not worker_id then
    return nil
  end
  return worker_id .. '"""
    + HOLDER_SEPARATOR
    + """' .. (attempts or '0')
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
# the fair order (cost / weight), the uploads' TTL in seconds, the tenant's max queued jobs (0: no limit), the
# tenant's submit counter of this minute and its limit (0: no limit), then (upload key, data URI) pairs: the
# job's inline input images, stored only when the job is created.
# Returns {1, position in its queue and priority} when created, {0, stored_request_hash, HGETALL of
# the earlier job} for an idempotent replay, {2, number queued} when max_queued jobs are queued, {3, number the
# tenant has queued} at the tenant's limit, or {4, jobs the tenant submitted this minute} at its rate limit. A
# replay is answered before any limit is read, and only a created job counts against the rate: a replay never
# uses up a submit. A created job wakes its queue's workers in the same step (worker.feeder).

PREAMBLE = _PREAMBLE  # what every script starts with: ns, the key names, the helpers above
