"""Lua scripts for a running job, held by its worker: renew its lease, write its progress and previews, wait
for storage (the spool), adopt a stopped worker's spooled job. Key names and helpers: `storage.lua_preamble`."""

from __future__ import annotations

from storage.lua_preamble import PREAMBLE as _PREAMBLE

# ARGV: ns, job_id, holder, lease_expires_at. Returns 1 if renewed.
RENEW_LEASE = (
    _PREAMBLE
    + """
if holder_of(KEYS[1]) ~= ARGV[3] then
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

# ARGV: ns, job_id, holder, now, reason. A running job this attempt holds waits for its images to be stored
# (worker.spool): since when (the first time) and why (the latest error). Returns 1, or 0 if not held.
SET_STORING = (
    _PREAMBLE
    + """
if holder_of(KEYS[1]) ~= ARGV[3] then
  return 0
end
redis.call('HSETNX', KEYS[1], 'storing_since', ARGV[4])
redis.call('HSET', KEYS[1], 'storing_reason', ARGV[5])
emit(ARGV[2], 'event', 'storing', 'reason', ARGV[5])
return 1
"""
)

# ARGV: ns, job_id, from_holder, worker_id, now, lease_expires_at. A stopped worker's spooled job, still held by the
# attempt that spooled it (from_holder), is held by worker_id from now on (the same attempt: nothing runs again).
# Returns HGETALL, or false if that attempt no longer holds it (it ended, or was re-queued and may run elsewhere).
ADOPT = (
    _PREAMBLE
    + """
if holder_of(KEYS[1]) ~= ARGV[3] then
  return false
end
redis.call('HSET', KEYS[1], 'worker_id', ARGV[4], 'lease_expires_at', ARGV[6])
redis.call('ZADD', leases_key, ARGV[6], ARGV[2])
return redis.call('HGETALL', KEYS[1])
"""
)
