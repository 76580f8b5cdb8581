"""Lua scripts for the job store's state transitions: each runs atomically inside Redis.

Here: creating a job and taking one. A running job's scripts are in `storage.lua_running`, the ending ones in
`storage.lua_ending`; the keys they share, the Lua helpers and the preamble every script starts with in
`storage.lua_preamble` (which documents the keys). All are reachable as `storage.lua.NAME`.
"""

from __future__ import annotations

from core.params import PRIORITIES
from storage.lua_ending import ADD_WEBHOOK_ATTEMPT, DELETE, FINISH, RELEASE, REQUEST_CANCEL
from storage.lua_preamble import PREAMBLE as _PREAMBLE
from storage.lua_preamble import WAKE_TOKENS
from storage.lua_running import ADD_PREVIEW, ADOPT, RENEW_LEASE, SET_PROGRESS, SET_STORING

__all__ = [
    "ADD_PREVIEW",
    "ADD_WEBHOOK_ATTEMPT",
    "ADOPT",
    "CREATE",
    "DELETE",
    "FINISH",
    "RELEASE",
    "RENEW_LEASE",
    "REQUEST_CANCEL",
    "SET_PROGRESS",
    "SET_STORING",
    "TAKE_NEXT",
    "WAKE_TOKENS",
]

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
local record = cjson.decode(ARGV[5])
local tenant_max_queued, rate_key, per_minute = tonumber(ARGV[8]), ARGV[9], tonumber(ARGV[10])
if tenant_max_queued > 0 then
  local tenant
  for i = 1, #record, 2 do
    if record[i] == 'tenant' then tenant = record[i + 1] end
  end
  local num_tenant_queued = redis.call('ZCARD', tenant_index('queued', tenant))
  if num_tenant_queued >= tenant_max_queued then
    return {3, num_tenant_queued}
  end
end
if per_minute > 0 then
  local num_submitted = tonumber(redis.call('GET', rate_key) or '0')
  if num_submitted >= per_minute then
    return {4, num_submitted}
  end
  redis.call('INCR', rate_key)
  redis.call('EXPIRE', rate_key, 120)
end
if KEYS[2] then
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[2], 'job_id', job_id, 'request_hash', ARGV[3])
end
for i = 11, #ARGV, 2 do
  redis.call('SET', ARGV[i], ARGV[i + 1], 'EX', tonumber(ARGV[7]))
end
redis.call('HSET', KEYS[1], unpack(record))
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

# ARGV: ns, queue, worker_id, now, lease_expires_at. What a worker's feeder does: take the queue's next job,
# highest priority first and within one priority the smallest fair-share tag (its holder is then
# worker_id#attempts: storage.lua_preamble's holder_of). Returns HGETALL, or false when nothing of that queue
# is queued. An index entry whose record is not queued (none should exist) is dropped on the way.
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
