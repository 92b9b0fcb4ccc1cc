"""The Lua scripts of `RedisSessionStore`: each check-and-write runs atomically in Redis.

Every script gets KEYS: episode (hash: data, revision, owner), known (the 410 tombstone,
"reason:owner"), live (all live ids by deadline), owned (the owner's live ids), lock; `ACQUIRE`
one more, the abandoned marker of its token; `RELEASE` gets the lock alone, `ABANDON` the lock
and the marker. A write's ARGV: data, revision, now_ms, ttl_ms, known_ttl_ms, id, owner.
"""

from __future__ import annotations

_WRITE = """
redis.call('HSET', KEYS[1], 'data', ARGV[1], 'revision', ARGV[2], 'owner', ARGV[7])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('SET', KEYS[2], 'expired:' .. ARGV[7], 'PX', ARGV[5])
redis.call('ZADD', KEYS[3], ARGV[3] + ARGV[4], ARGV[6])
redis.call('ZADD', KEYS[4], ARGV[3] + ARGV[4], ARGV[6])
redis.call('PEXPIRE', KEYS[4], ARGV[4])
"""
CREATE = (
    """
local evicted = redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[3])
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[8]) then return {-1, evicted} end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', ARGV[3])
local quota = tonumber(ARGV[9])
if quota > 0 and redis.call('ZCARD', KEYS[4]) >= quota then
  local oldest = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
  return {-2, evicted, oldest[2] or ARGV[3]}
end
"""
    + _WRITE
    + "return {1, evicted}"
)
"""ARGV: a write's, then the cap and the owner's quota (0: none). {1 | -1 (full), episodes
evicted}, or {-2 (quota), evicted, the owner's earliest idle deadline in ms}."""
_FIND = """
local found = redis.call('HMGET', KEYS[1], 'data', 'owner')
if not found[1] or (found[2] or '') ~= ARGV[1] then
  return {-1, redis.call('GET', KEYS[2]) or ''}
end
"""
"""The episode as found[1] if ARGV[1] owns it, else returns {-1, tombstone or ''} (404 or 410)."""
ACQUIRE = (
    "if redis.call('EXISTS', KEYS[6]) == 1 then return {0, ''} end\n"
    + _FIND
    + """
if not redis.call('SET', KEYS[5], ARGV[2], 'NX', 'PX', ARGV[3]) then return {0, ''} end
return {1, found[1]}
"""
)
"""KEYS: the five, then the token's abandoned marker. ARGV: owner, token, lock_ttl_ms. {1, data},
or {0, ''} while another request holds the lock. A caller that gave up (its call timed out in a
Redis stall) marks its token abandoned (`ABANDON`); a lock script of it that reaches Redis
after that takes nothing."""
COMMIT = (
    """
if redis.call('GET', KEYS[5]) ~= ARGV[8] then return 0 end
redis.call('DEL', KEYS[5])
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if ARGV[9] ~= '' and redis.call('HGET', KEYS[1], 'revision') ~= ARGV[9] then return -2 end
if ARGV[10] ~= '' then
  local now = redis.call('TIME')
  if now[1] * 1000000 + now[2] > tonumber(ARGV[10]) then return -3 end
end
"""
    + _WRITE
    + "return 1"
)
"""ARGV: a write's, then the lock token, the revision the change requires and its deadline in
unix microseconds ('' each: none; `service.preconditions`). 1, or nothing written: 0, the lock
expired (the batch outlived lock_ttl_s); -1, the episode expired meanwhile; -2, it is at
another revision; -3, the deadline passed on Redis's clock (one clock for every replica, read
at the write itself, so a replica that froze after its claim cannot apply a late change)."""
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""
"""KEYS: lock. ARGV: token."""
ABANDON = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return 0
"""
"""KEYS: lock, the token's abandoned marker. ARGV: token, marker_ttl_ms. Releases the lock of a
call that gave up, whether its lock script ran before this (the lock is deleted) or runs after
it (the marker stops it)."""
DELETE = (
    _FIND
    + """
if redis.call('EXISTS', KEYS[5]) == 1 then return {0, ''} end
if redis.call('HGET', KEYS[1], 'revision') ~= ARGV[4] then return {2, found[1]} end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[3])
redis.call('SET', KEYS[2], 'ended:' .. ARGV[1], 'PX', ARGV[2])
return {1, found[1]}
"""
)
"""ARGV: owner, ended_ttl_ms, id, the revision the caller read and decoded. {1, data}; {0, ''}
while a batch holds the lock; {2, data} without deleting when the stored revision is another
(or none was given): the caller decodes it first, so an unreadable record is never deleted."""
