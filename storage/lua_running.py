"""Lua scripts for a running job, held by its worker: renew its lease, write its progress and previews, wait
for storage (the spool), adopt a stopped worker's spooled job. Key names and helpers: `storage.lua_preamble`."""

from __future__ import annotations

from storage.lua_preamble import PREAMBLE as _PREAMBLE

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
