-- rdzv on Redis: the operations (helpers in prelude.lua). Each returns a table whose first
-- element says what happened: 'ok', 'conflict', 'missing', 'lease_not_found', 'future';
-- 'corrupt', 'epoch' and 'rollback' come from the dispatcher at the end.

-- Attaches a client: returns the namespace's epoch, creating it (from the server clock) if
-- the namespace is new.
local function op_init()
  local e = rcall(K_EPOCH, 'GET', K_EPOCH)
  if not e then
    local t = call('TIME')
    e = t[1] .. '.' .. t[2]
    call('SET', K_EPOCH, e)
  end
  return { 'ok', e }
end

local function op_get()
  prologue()
  local k = ARGV[8]
  local rec = load(k, true)
  if rec then
    return { 'ok', cur_rev(), reply_kv(k, rec) }
  end
  return { 'ok', cur_rev() }
end

-- ARGV: prefix, limit (0 = none), max create revision ('' = none), order ('key'|'create'),
-- keys only ('1'), count only ('1'). Reply: 'ok', revision, count, flat records.
local function op_range()
  prologue()
  local p = ARGV[8]
  local limit = tonumber(ARGV[9])
  local maxc = nil
  if ARGV[10] ~= '' then
    maxc = tonumber(ARGV[10])
  end
  local by_create = ARGV[11] == 'create'
  local keys_only = ARGV[12] == '1'
  local count_only = ARGV[13] == '1'
  local rev = cur_rev()
  local lo, hi = '-', '+'
  if #p > 0 then
    lo, hi = '[' .. p, lex_upper(p)
  end
  local count, keys
  if maxc == nil and not by_create then
    count = rcall(K_NAMES, 'ZLEXCOUNT', K_NAMES, lo, hi)
    if count_only then
      keys = {}
    elseif limit > 0 then
      keys = rcall(K_NAMES, 'ZRANGEBYLEX', K_NAMES, lo, hi, 'LIMIT', 0, limit)
    else
      keys = rcall(K_NAMES, 'ZRANGEBYLEX', K_NAMES, lo, hi)
    end
  elseif indexed(p) then
    local ik = ikey(p)
    local top = maxc and s(maxc) or '+inf'
    count = rcall(ik, 'ZCOUNT', ik, '-inf', top)
    if count_only then
      keys = {}
    elseif by_create and limit > 0 then
      keys = rcall(ik, 'ZRANGEBYSCORE', ik, '-inf', top, 'LIMIT', 0, limit)
    else
      keys = rcall(ik, 'ZRANGEBYSCORE', ik, '-inf', top)
      if not by_create then
        table.sort(keys)
      end
    end
  else
    -- A prefix without an index (see `dirs`): filter its keys (O(matches)).
    local sel = {}
    for _, k in ipairs(keys_with_prefix(p)) do
      local rec = load(k, false)
      if not rec then
        corrupt(dkey(k), 'indexed key has no record')
      end
      if maxc == nil or rec.c <= maxc then
        sel[#sel + 1] = { k, rec.c }
      end
    end
    if by_create then
      table.sort(sel, function(a, b) return a[2] < b[2] end)
    end
    count = #sel
    keys = {}
    if not count_only then
      for i, e in ipairs(sel) do
        keys[i] = e[1]
      end
    end
  end
  local out = {}
  for i, k in ipairs(keys) do
    if limit > 0 and i > limit then
      break
    end
    local rec = load(k, not keys_only)
    if not rec then
      corrupt(dkey(k), 'indexed key has no record')
    end
    for _, x in ipairs(reply_kv(k, rec)) do
      out[#out + 1] = x
    end
  end
  return { 'ok', rev, count, out }
end

local function conflict(k, rec)
  if rec then
    return { 'conflict', reply_kv(k, rec) }
  end
  return { 'conflict' }
end

-- Writes value `v` under `k` (current record `cur` or nil) bound to `lease` (0 = none), at
-- a new revision; returns the revision and the key's create revision.
local function write(k, v, cur, lease)
  local rev = next_rev()
  local rec
  if cur then
    rec = { v = v, c = cur.c, m = rev, n = cur.n + 1, l = lease }
  else
    rec = { v = v, c = rev, m = rev, n = 1, l = lease }
  end
  call('HSET', dkey(k), 'v', v, 'c', s(rec.c), 'm', s(rev), 'n', s(rec.n), 'l', s(lease))
  if not cur then
    index_add(k, rec.c)
  end
  if cur and cur.l ~= 0 and cur.l ~= lease then
    call('SREM', lease_keys_key(cur.l), k)
  end
  if lease ~= 0 then
    call('SADD', lease_keys_key(lease), k)
  end
  log_put(rev, 0, k, rec)
  trim(rev)
  return rev, rec.c
end

-- ARGV: key, value, mode ('o' overwrite | 'c' create | 'u' update), expected mod
-- revision, lease (0 = none). Reply: 'ok', revision, create revision.
local function op_put()
  prologue()
  local k, v, mode = ARGV[8], ARGV[9], ARGV[10]
  local expect, lease = tonumber(ARGV[11]), tonumber(ARGV[12])
  local cur = load(k, true)
  if mode == 'c' and cur then
    return conflict(k, cur)
  end
  if mode == 'u' and (not cur or cur.m ~= expect) then
    return conflict(k, cur)
  end
  if lease ~= 0 and not lease_alive(lease) then
    return { 'lease_not_found' }
  end
  local rev, c = write(k, v, cur, lease)
  return { 'ok', rev, c }
end

-- ARGV: key, value, lease (0 = none), tally key, tally lease (0 = none). Creates key if
-- absent and puts the tally key (empty value), whose version is then the number of
-- creations it counted. Reply: 'ok', revision, create revision, tally; 'conflict' with the
-- current key; 'lease_not_found', the missing lease.
local function op_create_counted()
  prologue()
  local k, v, lease = ARGV[8], ARGV[9], tonumber(ARGV[10])
  local t, tally_lease = ARGV[11], tonumber(ARGV[12])
  local cur = load(k, true)
  if cur then
    return conflict(k, cur)
  end
  for _, l in ipairs({ lease, tally_lease }) do
    if l ~= 0 and not lease_alive(l) then
      return { 'lease_not_found', l }
    end
  end
  local rev, c = write(k, v, nil, lease)
  local tcur = load(t, true)
  write(t, '', tcur, tally_lease)
  local count = 1
  if tcur then
    count = tcur.n + 1
  end
  return { 'ok', rev, c, count }
end

-- ARGV: key, delta. Adds delta to the decimal integer at key (missing = 0), written like
-- an unconditional put without lease. Reply: 'ok', new value; 'not_integer'; 'fallback'
-- when the numbers leave the range Lua's doubles hold exactly (the client then uses
-- compare-and-swap, which is exact).
local function op_incr()
  prologue()
  local k, delta = ARGV[8], tonumber(ARGV[9])
  local cur = load(k, true)
  local n = 0
  if cur then
    if not string.match(cur.v, '^[+-]?%d+$') then
      return { 'not_integer' }
    end
    n = tonumber(cur.v)
  end
  local exact = 9007199254740992
  if math.abs(n) >= exact or math.abs(delta) >= exact or math.abs(n + delta) >= exact then
    return { 'fallback' }
  end
  local v = s(n + delta)
  write(k, v, cur, 0)
  return { 'ok', v }
end

-- ARGV: key, mode ('a' any | 'i' if mod revision), expected mod revision.
local function op_delete()
  prologue()
  local k, mode, expect = ARGV[8], ARGV[9], tonumber(ARGV[10])
  local cur = load(k, true)
  if mode == 'i' and (not cur or cur.m ~= expect) then
    return conflict(k, cur)
  end
  if not cur then
    return { 'missing' }
  end
  local rev = next_rev()
  remove(k, cur)
  log_del(rev, 0, k)
  trim(rev)
  return { 'ok', rev }
end

-- ARGV: prefix (not empty), limit (0 = every key; else the first `limit` in key order).
-- Reply: 'ok', deleted, revision.
local function op_delete_prefix()
  prologue()
  local recs = {}
  for _, k in ipairs(keys_with_prefix(ARGV[8], tonumber(ARGV[9]))) do
    local rec = load(k, false)
    if not rec then
      corrupt(dkey(k), 'indexed key has no record')
    end
    recs[#recs + 1] = { k, rec }
  end
  if #recs == 0 then
    return { 'ok', 0, cur_rev() }
  end
  local rev = next_rev()
  for i, e in ipairs(recs) do
    remove(e[1], e[2])
    log_del(rev, i - 1, e[1])
  end
  trim(rev)
  return { 'ok', #recs, rev }
end

-- ARGV: ttl in ms. Reply: 'ok', lease id.
local function op_grant()
  local now = prologue()
  local ttl = tonumber(ARGV[8])
  local id = call('INCR', K_LEASEID)
  call('ZADD', K_LEASES, s(now + ttl), s(id))
  call('HSET', K_LTTL, s(id), s(ttl))
  return { 'ok', id }
end

-- ARGV: lease id. Reply: 'ok', ttl in ms.
local function op_keep_alive()
  local now = prologue()
  local id = tonumber(ARGV[8])
  if not lease_alive(id) then
    return { 'lease_not_found' }
  end
  local ttl = tonumber(rcall(K_LTTL, 'HGET', K_LTTL, s(id)))
  if not ttl then
    corrupt(K_LTTL, 'lease ' .. s(id) .. ' has no TTL')
  end
  call('ZADD', K_LEASES, s(now + ttl), s(id))
  return { 'ok', ttl }
end

-- ARGV: lease ids. Reply: 'ok', then per lease its ttl in ms, or -1 if it is gone.
local function op_keep_alive_many()
  local now = prologue()
  local ttls = { 'ok' }
  for i = 8, #ARGV do
    local id = tonumber(ARGV[i])
    local ttl = -1
    if lease_alive(id) then
      ttl = tonumber(rcall(K_LTTL, 'HGET', K_LTTL, s(id)))
      if not ttl then
        corrupt(K_LTTL, 'lease ' .. s(id) .. ' has no TTL')
      end
      call('ZADD', K_LEASES, s(now + ttl), s(id))
    end
    ttls[#ttls + 1] = ttl
  end
  return ttls
end

-- ARGV: lease id.
local function op_revoke()
  prologue()
  local id = tonumber(ARGV[8])
  if not lease_alive(id) then
    return { 'lease_not_found' }
  end
  end_lease(id)
  return { 'ok' }
end

-- The background reaper's call. Reply: 'ok', ms until the next lease deadline (-1: none).
local function op_reap()
  local now = prologue()
  local first = call('ZRANGE', K_LEASES, 0, 0, 'WITHSCORES')
  if #first == 0 then
    return { 'ok', -1 }
  end
  return { 'ok', math.max(0, tonumber(first[2]) - now) }
end

-- ARGV: revision. Discards the log before it. Reply: 'ok', oldest available revision.
local function op_compact()
  prologue()
  local rev = tonumber(ARGV[8])
  local cur = cur_rev()
  if rev > cur then
    return { 'future', cur }
  end
  trim_log(cur, rev, false)
  return { 'ok', math.max(1, compacted()) }
end

-- A client whose watch feed found a rollback tells the others: the namespace gets a new
-- epoch, unless it already has one. Reply: 'ok'.
local function op_mark_rolled_back()
  local e = rcall(K_EPOCH, 'GET', K_EPOCH)
  if e == ARGV[2] then
    mark_rolled_back(cur_rev())
  end
  return { 'ok' }
end

local ops = {
  init = op_init,
  get = op_get,
  range = op_range,
  put = op_put,
  create_counted = op_create_counted,
  incr = op_incr,
  delete = op_delete,
  delete_prefix = op_delete_prefix,
  grant = op_grant,
  keep_alive = op_keep_alive,
  keep_alive_many = op_keep_alive_many,
  revoke = op_revoke,
  reap = op_reap,
  compact = op_compact,
  mark_rolled_back = op_mark_rolled_back,
}

local f = ops[ARGV[7]]
if not f then
  return redis.error_reply('rdzv: unknown operation ' .. tostring(ARGV[7]))
end
local ok, res = pcall(f)
if ok then
  return res
end
if type(res) == 'table' and res.rdzv_corrupt then
  return { 'corrupt', res.key, res.msg }
end
if type(res) == 'table' and res.rdzv_epoch then
  return { 'epoch', res.found }
end
if type(res) == 'table' and res.rdzv_rollback then
  return { 'rollback', res.rev, res.seen, res.lease, res.seen_lease }
end
if type(res) == 'table' and res.rdzv_error then
  -- Returned, not raised: a raised error would lose its code to a script trace.
  return redis.error_reply(res.rdzv_error)
end
error(res)
