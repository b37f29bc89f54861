// The Lua scripts of the Redis backend. Each runs atomically on the server,
// declares every key it touches (KEYS), and reads the time from the server
// (TIME), so a decision never depends on a client clock.
//
// KEYS, for mutex M, in every script:
//   KEYS[1] = simba:{M}            lock (JVM Simba's key; value = owner id)
//   KEYS[2] = simba:{M}:contender  wait queue (JVM Simba's key)
//   KEYS[3] = simba:{M}:fence      hash: token, owner, ttl (ms), tr (ms),
//                                  heir, heir_until (ms), streak_since (ms)
//
// The effects a JVM Simba process can see are exactly its own scripts'
// effects (simba-behaviour.md §3.2): the lock key with PX = ttl + transition,
// ZADD NX with the server time in seconds (ours with microseconds as a
// fraction) when an acquisition fails,
// `acquired@@<id>` on simba:{M}, and `released@@<by>` on the personal
// channel simba:{M}:<waiter> of the oldest waiter. On top of that:
//   - the releaser and dead waiters (PUBLISH reached nobody) are dropped from
//     the queue instead of swallowing the wake-up;
//   - an acquisition removes the acquirer from the queue, and a failed one
//     removes the current owner and the oldest entries nobody listens for;
//   - every release is also published on simba:{M}:@@released (no JVM id can
//     contain "@@"), which retrievers listen to;
//   - a forced release also sends `released@@<owner>` to the owner's own
//     personal channel, so the owner learns of its loss at once;
//   - a release in the first 2 ms of its owner's streak (from the
//     acquisition that made it the owner) wakes the oldest waiter, which
//     keeps its place; a later one makes the woken waiter the heir for
//     100 ms: until it acquires (or that time is over), another acquirer of
//     ours is answered `held` by the heir (token '0') and queued, so the
//     releaser cannot barge back in ahead of the waiters for longer than
//     its streak (JVM Simba's own scripts ignore the streak and the heir).
//
// Replies are arrays of strings (Lua numbers above 2^31 are not safe to send
// through redis.call as numbers, so they are formatted with %d):
//   acquire:  {outcome, owner, pttl, token, now_ms, ttl, tr}
//             outcome = acquired | renewed | held | free | guard
//             (free: no owner yet no acquisition because of the restart
//             guard; pttl then holds the milliseconds the guard has left)
//   release:  1 | 0
//   leave:    0
//   force:    {owner, pttl, token, now_ms, ttl, tr, floor}
//   read:     {owner, pttl, token, now_ms, ttl, tr}
//   renew:    {read-shaped array, ...}, one a mutex
//   waiters:  {id, ...}, the live waiters oldest first
// where ttl and tr are the owner's ttl and transition ('0' when unknown: the
// owner is a JVM Simba process).

#ifndef SIMBA_BACKENDS_REDIS_REDIS_SCRIPTS_H_
#define SIMBA_BACKENDS_REDIS_REDIS_SCRIPTS_H_

namespace simba::internal::redis {

// Shared helpers, prepended to every script.
inline constexpr char kLuaPrelude[] = R"lua(
local lock, queue, fence = KEYS[1], KEYS[2], KEYS[3]

local function fmt(n) return string.format('%d', n) end

-- A waiter's place in the queue: the server time in seconds, as JVM Simba
-- writes it, but with the microseconds as a fraction. Whole seconds put
-- every waiter of one second in a tie, which Redis breaks by the id: the
-- same waiter came first at every release and the others starved. A JVM
-- entry (whole seconds) still sorts by when it came.
local function arrived(us) return string.format('%.6f', us / 1000000) end

-- Server time: milliseconds, microseconds, seconds.
local function now()
  local t = redis.call('TIME')
  local s, u = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(u / 1000), s * 1000000 + u, s
end

-- The fence fields that belong to `owner` (all '0' when it got the lock
-- without us, e.g. from JVM Simba, or there is no owner).
local function fence_of(owner)
  local f = redis.call('HMGET', fence, 'owner', 'token', 'ttl', 'tr')
  if owner and f[1] == owner then return f[2] or '0', f[3] or '0', f[4] or '0' end
  return '0', '0', '0'
end

-- The token of `id`'s hold, the lock key naming `id`, its fence's ttl and tr
-- set to the caller's. A lock key of ours whose fence does not name us (the
-- fence was evicted or deleted, or a replica got the lock back by a
-- replicated renewal after it lost both keys) gets a fence anew, under a
-- token above every earlier one: answering '0' (a JVM Simba owner's token)
-- would hand our contender a hold under a token below its last one.
local function own_fence(id, ttl, tr, ms, us)
  local f = redis.call('HMGET', fence, 'owner', 'token')
  if f[1] == id and f[2] then
    redis.call('HSET', fence, 'ttl', ttl, 'tr', tr)
    return f[2]
  end
  local token = fmt(math.max(tonumber(f[2] or '0') + 1, us))
  redis.call('HSET', fence, 'token', token, 'owner', id, 'ttl', ttl, 'tr', tr, 'heir', '',
             'streak_since', fmt(ms))
  return token
end

-- How long a free mutex is kept for the waiter a release woke (its heir),
-- in ms: its wake-up and its acquisition, a round trip and a thread hop,
-- fit well within it. Meanwhile anyone else (the releaser coming straight
-- back, above all) is told the heir holds it, and queues.
local heir_ms = 100

-- How long one holder may keep taking the mutex straight back after its
-- own release (its streak, in ms, from the acquisition that made it the
-- owner) before a release hands the mutex to the oldest waiter. Within
-- it, a holder in a loop runs at its own pace instead of one hand-off per
-- acquisition; after it, the waiters are served in turn, each with a
-- streak of its own.
local streak_ms = 2

-- Announce a release and wake the oldest waiter that is still listening.
-- Entries of the releaser itself and of waiters nobody listens for any
-- more are removed on the way. When the releaser's streak is over (or
-- `handoff`), the woken waiter becomes the heir until `ms` + heir_ms and
-- leaves the queue (as JVM Simba's woken waiter does); within the streak
-- it keeps its place, and tries: it takes the mutex unless the releaser
-- has come straight back.
local function wake(by, ms, handoff)
  redis.call('PUBLISH', lock .. ':@@released', 'released@@' .. by)
  if not handoff then
    local f = redis.call('HMGET', fence, 'owner', 'streak_since')
    handoff = f[1] ~= by or not f[2] or tonumber(f[2]) + streak_ms <= ms
  end
  for _ = 1, 64 do
    local w = redis.call('ZRANGE', queue, 0, 0)[1]
    if not w then return end
    if w ~= by and redis.call('PUBLISH', lock .. ':' .. w, 'released@@' .. by) > 0 then
      if handoff then
        redis.call('ZREM', queue, w)
        redis.call('HSET', fence, 'heir', w, 'heir_until', fmt(ms + heir_ms))
      end
      return
    end
    redis.call('ZREM', queue, w)
  end
end

-- Drop the oldest queue entries whose contender no longer listens, so ids
-- of crashed processes do not pile up when no release ever comes.
local function trim()
  for _, w in ipairs(redis.call('ZRANGE', queue, 0, 1)) do
    if redis.call('PUBSUB', 'NUMSUB', lock .. ':' .. w)[2] == 0 then
      redis.call('ZREM', queue, w)
    end
  end
end
)lua";

// ARGV: id, ttl, transition, guard_until_ms (0 = none), and behind
// Sentinel the primary's term (its master_replid when the client connected)
// with KEYS[4] = <prefix>:@@term, a hash {id, since, px}; px = ttl +
// transition. On a promoted node of a Redis Cluster the term comes without
// KEYS[4] and is kept in the mutex's fence hash {term, term_since, term_px}
// (no key every slot can reach exists there).
// The term is the server's master_replid as the script runs (the client's
// only if INFO does not say): a restarted primary changes it again when its
// first replica syncs, and clients connected before and after would record
// their two ids in turn, each restarting the guard, for as long as both ask.
// A term other than the one recorded is a new primary (a failover, or a
// restart that forgot everything): it is recorded from now, and no free
// mutex is taken until the largest lease known may have ended (the guard).
inline constexpr char kLuaAcquire[] = R"lua(
local id, ttl, tr, guard = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local px = tonumber(ttl) + tonumber(tr)
local ms, us, sec = now()
if ARGV[5] then
  local term = string.match(redis.call('INFO', 'replication'), 'master_replid:(%w+)') or ARGV[5]
  local tk, f = KEYS[4], {'id', 'since', 'px'}
  if not tk then tk, f = fence, {'term', 'term_since', 'term_px'} end
  local t = redis.call('HMGET', tk, f[1], f[2], f[3])
  local since, tpx = ms, math.max(px, tonumber(t[3] or '0'))
  if t[1] == term then
    since = tonumber(t[2])
  else
    redis.call('HSET', tk, f[1], term, f[2], fmt(ms))
  end
  if tpx > tonumber(t[3] or '0') then redis.call('HSET', tk, f[3], fmt(tpx)) end
  guard = math.max(guard, since + tpx)
end
local owner = redis.call('GET', lock)
if owner == id then
  redis.call('SET', lock, id, 'XX', 'PX', px)
  return {'renewed', id, fmt(px), own_fence(id, ttl, tr, ms, us), fmt(ms), ttl, tr}
end
if owner then
  redis.call('ZADD', queue, 'NX', arrived(us), id)
  redis.call('ZREM', queue, owner)
  trim()
  local token, ottl, otr = fence_of(owner)
  return {'held', owner, fmt(redis.call('PTTL', lock)), token, fmt(ms), ottl, otr}
end
-- Free, but kept for the waiter the release woke: anyone else queues
-- behind it (and hears of it as the owner, with unknown times, until the
-- heir_until), so a releaser that comes straight back cannot take the mutex
-- from the waiters again and again.
local heir = redis.call('HMGET', fence, 'heir', 'heir_until')
if heir[1] and heir[1] ~= '' and heir[1] ~= id and tonumber(heir[2] or '0') > ms then
  redis.call('ZADD', queue, 'NX', arrived(us), id)
  return {'held', heir[1], fmt(tonumber(heir[2]) - ms), '0', fmt(ms), '0', '0'}
end
if ms < guard then
  return {'free', '', fmt(guard - ms), '0', fmt(ms), '0', '0'}
end
redis.call('SET', lock, id, 'PX', px)
local last = redis.call('HMGET', fence, 'token', 'owner', 'streak_since')
local token = math.max(tonumber(last[1] or '0') + 1, us)
local since = fmt(ms)
if last[2] == id and last[3] then since = last[3] end
redis.call('HSET', fence, 'token', fmt(token), 'owner', id, 'ttl', ttl, 'tr', tr, 'heir', '',
           'streak_since', since)
redis.call('ZREM', queue, id)
redis.call('PUBLISH', lock, 'acquired@@' .. id)
return {'acquired', id, fmt(px), fmt(token), fmt(ms), ttl, tr}
)lua";

// ARGV: id, token ('0': any). Not the owner: leave the queue (JVM Simba's
// effect). The owner under another token (a late release of an earlier
// ownership): change nothing.
inline constexpr char kLuaRelease[] = R"lua(
local id, token = ARGV[1], ARGV[2]
if redis.call('GET', lock) ~= id then
  redis.call('ZREM', queue, id)
  return 0
end
if token ~= '0' and fence_of(id) ~= token then return 0 end
redis.call('DEL', lock)
wake(id, now(), false)
return 1
)lua";

// ARGV: id. A waiter gives up: out of the queue, the lock left alone even
// if it holds it (see Backend::leave). A free mutex that no other heir is
// coming for may have been waiting for this one (it was woken as the heir,
// or within a streak, as it left): the wake-up goes on to the next waiter,
// who would otherwise sleep until its next poll.
inline constexpr char kLuaLeave[] = R"lua(
local id = ARGV[1]
redis.call('ZREM', queue, id)
local heir = redis.call('HMGET', fence, 'heir', 'heir_until')
if heir[1] == id then redis.call('HSET', fence, 'heir', '') end
local ms = now()
if not redis.call('GET', lock) and (heir[1] == id or not heir[1] or heir[1] == '' or
                                    tonumber(heir[2] or '0') <= ms) then
  wake(id, ms, true)
end
return 0
)lua";

// No ARGV. Frees the lock whoever holds it and raises the fencing counter.
inline constexpr char kLuaForceRelease[] = R"lua(
local ms, us = now()
local owner = redis.call('GET', lock)
local pttl, token, ottl, otr = '-2', '0', '0', '0'
if owner then
  pttl = fmt(redis.call('PTTL', lock))
  token, ottl, otr = fence_of(owner)
end
local floor = math.max(tonumber(redis.call('HGET', fence, 'token') or '0') + 1, us)
redis.call('HSET', fence, 'token', fmt(floor), 'owner', '')
if owner then
  redis.call('DEL', lock)
  -- Tell the owner at once on its personal channel, where nothing else
  -- ever names it as the releaser (wake() skips the releaser). JVM Simba
  -- takes any `released@@` there as "the owner is gone, try now", so it
  -- learns too.
  redis.call('PUBLISH', lock .. ':' .. owner, 'released@@' .. owner)
  wake(owner, ms, true)
end
return {owner or '', pttl, token, fmt(ms), ottl, otr, fmt(floor)}
)lua";

// KEYS: the three keys of each mutex in turn; ARGV: id, ttl, transition of
// each in turn (the factory's renewals together, Backend::renew). Renews
// each lock its id holds as the acquire script's renewal does (SET XX PX
// ttl + transition; own_fence: the fence's ttl and tr, or a fence anew), and
// takes nothing: every other mutex, free or not, is only read. Neither the
// queue nor the primary's term is touched (an acquisition records the term;
// one recorded later only makes the restart guard end later). One array a
// mutex, shaped as the read script's reply.
inline constexpr char kLuaRenew[] = R"lua(
local out = {}
local ms, us = now()
for i = 0, #KEYS / 3 - 1 do
  -- The prelude's lock, queue and fence (fence_of reads them) name this
  -- mutex's keys now.
  lock, queue, fence = KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3]
  local id, ttl, tr = ARGV[3 * i + 1], ARGV[3 * i + 2], ARGV[3 * i + 3]
  local owner = redis.call('GET', lock)
  if owner == id then
    local px = tonumber(ttl) + tonumber(tr)
    redis.call('SET', lock, id, 'XX', 'PX', px)
    out[#out + 1] = {id, fmt(px), own_fence(id, ttl, tr, ms, us), fmt(ms), ttl, tr}
  elseif owner then
    local token, ottl, otr = fence_of(owner)
    out[#out + 1] = {owner, fmt(redis.call('PTTL', lock)), token, fmt(ms), ottl, otr}
  else
    out[#out + 1] = {'', '-2', '0', fmt(ms), '0', '0'}
  end
end
return out
)lua";

// No ARGV.
inline constexpr char kLuaRead[] = R"lua(
local ms = now()
local owner = redis.call('GET', lock)
if not owner then return {'', '-2', '0', fmt(ms), '0', '0'} end
local token, ottl, otr = fence_of(owner)
return {owner, fmt(redis.call('PTTL', lock)), token, fmt(ms), ottl, otr}
)lua";

// No ARGV. Read-only: the queue's entries oldest first (ZADD NX keeps the
// second of a contender's first failed acquisition; ties go by id), without
// the owner and without entries nobody listens for any more (dead waiters,
// which wake() and trim() would drop), so the dashboard shows who is really
// waiting. Changes nothing, so JVM Simba sees no difference.
inline constexpr char kLuaWaiters[] = R"lua(
local owner = redis.call('GET', lock)
local out = {}
for _, w in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
  if w ~= owner and redis.call('PUBSUB', 'NUMSUB', lock .. ':' .. w)[2] > 0 then
    out[#out + 1] = w
  end
end
return out
)lua";

}  // namespace simba::internal::redis

#endif  // SIMBA_BACKENDS_REDIS_REDIS_SCRIPTS_H_
