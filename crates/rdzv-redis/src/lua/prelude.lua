-- rdzv on Redis: the helpers shared by every operation (see ops.lua for the operations).
--
-- Calling convention: KEYS[1] = <base>rev (routes the call to the namespace's slot);
-- ARGV[1] = <base> = "{rdzv:<namespace>}:", ARGV[2] = the epoch the client attached to,
-- ARGV[3] = how many revisions of history the event log keeps, ARGV[4] = the highest
-- revision and ARGV[5] = the highest lease id this client has seen (rollback detection),
-- ARGV[6] = how many bytes of events the log keeps at most (beyond its newest revision),
-- ARGV[7] = the operation, ARGV[8..] = its arguments. Every key touched starts with <base>,
-- so one hash slot.
--
-- Nothing here rolls back: Redis applies a script's writes as they happen. So every
-- operation first reads and validates all it needs (a foreign value under our keys aborts
-- the script before its first write), then writes.

local B = ARGV[1]
local K_REV = B .. 'rev'
local K_EPOCH = B .. 'epoch'
local K_NAMES = B .. 'names'
local K_LOG = B .. 'log'
local K_COMPACTED = B .. 'compacted'
local K_LEASES = B .. 'leases'
local K_LTTL = B .. 'lttl'
local K_LEASEID = B .. 'leaseid'
local K_LOGBYTES = B .. 'logbytes'
local K_LOGSZ = B .. 'logsz'
local HISTORY = tonumber(ARGV[3])
local SEEN_REV = tonumber(ARGV[4]) or 0
local SEEN_LEASE = tonumber(ARGV[5]) or 0
local HISTORY_BYTES = tonumber(ARGV[6])

-- What one log entry counts for in the log's byte bound: its key and value, plus a fixed
-- allowance for its id, field names and metadata.
local ENTRY_OVERHEAD = 64

-- Which '/' of a key end an indexed prefix (see `dirs`): the MIN_SLASHES-th to the
-- MAX_SLASHES-th, so a write costs at most MAX_SLASHES - MIN_SLASHES + 1 index entries
-- (plus the key's name), however long or oddly shaped its key.
local MIN_SLASHES = 5
local MAX_SLASHES = 16

-- Lua turns numbers into strings with "%.14g"; revisions are integers and must stay exact.
local function s(n)
  return string.format('%d', n)
end

-- Aborts the operation: the client reports a foreign or damaged value under `key`.
local function corrupt(key, msg)
  error({ rdzv_corrupt = true, key = key, msg = msg })
end

-- Raises a NOPERM error naming the command if this user's ACL forbids `cmd` with these
-- arguments (Redis 7.0 reports a command refused inside a script as a plain ERR that names
-- neither the command nor the rule).
local function check_acl(cmd, ...)
  if redis.acl_check_cmd and not redis.acl_check_cmd(cmd, ...) then
    local key = select(1, ...)
    error({ rdzv_error = 'NOPERM this user may not run ' .. string.lower(cmd) .. ' on ' ..
      tostring(key) .. ' (in rdzv\'s script)' })
  end
end

-- redis.call, with a refused command named (see check_acl). A server error (out of memory,
-- read-only replica…) ends the script as the reply, keeping its code (`OOM`, `READONLY`):
-- raised as is, it would reach the client as a plain ERR with a script trace.
local function call(cmd, ...)
  local r = redis.pcall(cmd, ...)
  if type(r) == 'table' and r.err then
    check_acl(cmd, ...)
    error({ rdzv_error = r.err })
  end
  return r
end

-- call() that names the key in the error when the key holds a foreign type.
local function rcall(key, cmd, ...)
  local r = redis.pcall(cmd, ...)
  if type(r) == 'table' and r.err then
    check_acl(cmd, ...)
    corrupt(key, r.err)
  end
  return r
end

-- An integer stored by us as a string, or `default` when absent.
local function int_at(key, default)
  local v = rcall(key, 'GET', key)
  if not v then
    return default
  end
  local n = tonumber(v)
  if not n or n < 0 or n ~= math.floor(n) then
    corrupt(key, 'expected a non-negative integer')
  end
  return n
end

local function now_ms()
  local t = call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function cur_rev()
  return int_at(K_REV, 0)
end

local function compacted()
  return int_at(K_COMPACTED, 0)
end

local function next_rev()
  return call('INCR', K_REV)
end

local function dkey(k)
  return B .. 'k:' .. k
end

local function lease_keys_key(id)
  return B .. 'lk:' .. s(id)
end

-- The record of user key `k`, or nil: { v = value or nil, c, m, n (version), l (lease, 0 = none) }.
local function load(k, with_value)
  local dk = dkey(k)
  local h = rcall(dk, 'HMGET', dk, 'c', 'm', 'n', 'l', with_value and 'v' or 'c')
  if not h[1] then
    if call('EXISTS', dk) == 1 then
      corrupt(dk, 'not a key record written by rdzv (no create revision)')
    end
    return nil
  end
  local c, m, n, l = tonumber(h[1]), tonumber(h[2]), tonumber(h[3]), tonumber(h[4])
  if not (c and m and n and l) or (with_value and not h[5]) then
    corrupt(dk, 'not a key record written by rdzv (bad metadata)')
  end
  local rec = { c = c, m = m, n = n, l = l }
  if with_value then
    rec.v = h[5]
  end
  return rec
end

-- A record as a flat reply: key, value, create, mod, version, lease.
local function reply_kv(k, rec)
  return { k, rec.v or '', rec.c, rec.m, rec.n, rec.l }
end

-- The indexed prefixes of `k`: those ending at its MIN_SLASHES-th to MAX_SLASHES-th '/'.
-- Each has a create-revision index, so a query of such a prefix by creation order, or
-- counting the keys created up to a revision, takes O(log N); any other prefix is answered
-- by filtering its keys (O(matches)). Whether a prefix is indexed depends on the prefix
-- alone (never on the rest of the key), so its index holds every key under it.
--
-- Why not shallower, or at '_': each index costs every write and delete of a key under it a
-- sorted-set update, and the shallowest hold every key of all runs or of the namespace. The
-- rendezvous asks for creation order only under a round's `join/` and `waiting/`
-- (`<prefix>/run_<id>/rdzv/v_<n>/join/`: at least five '/' whatever the prefix). Indexing
-- the empty prefix, the first four '/' and the first two '_' of each segment as well (11
-- sorted-set entries for a rank key, 3 now) cost Redis a quarter more CPU at 8,192 workers.
local function dirs(k)
  local res = {}
  local slashes = 0
  local i = 0
  while slashes < MAX_SLASHES do
    i = string.find(k, '/', i + 1, true)
    if not i then
      break
    end
    slashes = slashes + 1
    if slashes >= MIN_SLASHES then
      res[#res + 1] = string.sub(k, 1, i)
    end
  end
  return res
end

-- Whether prefix `p` has an index (see `dirs`).
local function indexed(p)
  local d = dirs(p)
  return d[#d] == p
end

local function ikey(dir)
  return B .. 'i:' .. dir
end

local function index_add(k, c)
  call('ZADD', K_NAMES, 0, k)
  for _, d in ipairs(dirs(k)) do
    call('ZADD', ikey(d), c, k)
  end
end

local function index_rem(k)
  call('ZREM', K_NAMES, k)
  for _, d in ipairs(dirs(k)) do
    call('ZREM', ikey(d), k)
  end
end

-- The exclusive upper bound of the keys starting with `p` for ZRANGEBYLEX, or '+'.
local function lex_upper(p)
  while #p > 0 and string.byte(p, #p) == 255 do
    p = string.sub(p, 1, #p - 1)
  end
  if #p == 0 then
    return '+'
  end
  return '(' .. string.sub(p, 1, #p - 1) .. string.char(string.byte(p, #p) + 1)
end

-- Every key starting with `p`, in key order.
local function keys_with_prefix(p, limit)
  local lo, hi = '-', '+'
  if #p > 0 then
    lo, hi = '[' .. p, lex_upper(p)
  end
  if limit and limit > 0 then
    return rcall(K_NAMES, 'ZRANGEBYLEX', K_NAMES, lo, hi, 'LIMIT', 0, limit)
  end
  return rcall(K_NAMES, 'ZRANGEBYLEX', K_NAMES, lo, hi)
end

-- Drops the log's oldest revisions: every one below `keep` and then, while the log counts
-- more than HISTORY_BYTES, more of them, never `rev` (the newest). Whole revisions only
-- (exact trimming, not '~'), which is what lets a watch tell a compacted gap from a
-- complete revision; the `compacted` mark says where the log now starts. The sizes come
-- from the `logsz` stream (one small entry per event, same ids as the log), so the values
-- being dropped are never read into the script's memory.
--
-- `lazy`: nothing is dropped until the log is over a bound by a sixteenth of it
-- (HISTORY / 16 revisions, HISTORY_BYTES / 16 bytes), and then it goes back to its bounds at
-- once: a log at its bound is trimmed once per HISTORY / 16 writes instead of a revision by
-- every write (which made every write of a busy run read the log's oldest entries, and
-- took Redis's time per write from ~60 µs to ~260 µs at 8,192 workers).
local function trim_log(rev, keep, lazy)
  local bytes = int_at(K_LOGBYTES, 0)
  local kept = compacted()
  local slack, slack_bytes = 0, 0
  if lazy then
    slack, slack_bytes = math.floor(HISTORY / 16), math.floor(HISTORY_BYTES / 16)
  end
  if keep <= kept + slack and bytes <= HISTORY_BYTES + slack_bytes then
    return
  end
  local freed, cut, prev = 0, keep, nil
  local from = '-'
  local done = false
  -- Small reads first: most trims drop a few revisions.
  local count = 32
  while not done do
    local batch = rcall(K_LOGSZ, 'XRANGE', K_LOGSZ, from, '+', 'COUNT', count)
    count = math.min(count * 2, 1024)
    if #batch == 0 then
      break
    end
    for _, e in ipairs(batch) do
      local r = tonumber(string.match(e[1], '^(%d+)-'))
      local z = tonumber(e[2][2])
      if not (r and z) then
        corrupt(K_LOGSZ, 'bad entry ' .. tostring(e[1]))
      end
      -- Stop at the newest revision, or at the first one that may stay (the rest of a
      -- revision already being dropped goes too).
      if r >= rev or (r >= keep and r ~= prev and bytes - freed <= HISTORY_BYTES) then
        done = true
        break
      end
      freed = freed + z
      prev = r
      if r + 1 > cut then
        cut = r + 1
      end
    end
    from = '(' .. batch[#batch][1]
  end
  if cut > kept then
    call('SET', K_COMPACTED, s(cut))
    call('XTRIM', K_LOG, 'MINID', s(cut) .. '-0')
    call('XTRIM', K_LOGSZ, 'MINID', s(cut) .. '-0')
  end
  call('SET', K_LOGBYTES, s(math.max(0, bytes - freed)))
end

-- Keeps the last HISTORY revisions in the log, within HISTORY_BYTES; older ones are
-- compacted away, a sixteenth of the bounds at a time (see trim_log).
local function trim(rev)
  trim_log(rev, rev - HISTORY + 1, true)
end

-- Counts an event of `size` bytes (plus the overhead) in the log's byte bound.
local function log_size(id, size)
  local z = ENTRY_OVERHEAD + size
  call('XADD', K_LOGSZ, id, 'z', s(z))
  call('INCRBY', K_LOGBYTES, z)
end

local function log_put(rev, seq, k, rec)
  local id = s(rev) .. '-' .. s(seq)
  call('XADD', K_LOG, id, 't', 'p', 'k', k, 'v', rec.v,
    'c', s(rec.c), 'm', s(rec.m), 'n', s(rec.n), 'l', s(rec.l))
  log_size(id, #k + #rec.v)
end

local function log_del(rev, seq, k)
  local id = s(rev) .. '-' .. s(seq)
  call('XADD', K_LOG, id, 't', 'd', 'k', k)
  log_size(id, #k)
end

-- Removes a (validated) record and its index entries; the caller logs the event.
local function remove(k, rec)
  call('DEL', dkey(k))
  index_rem(k)
  if rec.l ~= 0 then
    call('SREM', lease_keys_key(rec.l), k)
  end
end

-- Ends lease `id`: its keys are deleted at one new revision (if it has any), with events.
local function end_lease(id)
  local lk = lease_keys_key(id)
  local keys = rcall(lk, 'SMEMBERS', lk)
  local live = {}
  for _, k in ipairs(keys) do
    local rec = load(k, false)
    if rec and rec.l == id then
      live[#live + 1] = { k, rec }
    end
  end
  call('DEL', lk)
  call('ZREM', K_LEASES, s(id))
  call('HDEL', K_LTTL, s(id))
  if #live > 0 then
    table.sort(live, function(a, b) return a[1] < b[1] end)
    local rev = next_rev()
    for i, e in ipairs(live) do
      remove(e[1], e[2])
      log_del(rev, i - 1, e[1])
    end
    trim(rev)
  end
end

-- Ends every lease whose deadline (server clock) has passed.
local function reap()
  local now = now_ms()
  local ids = rcall(K_LEASES, 'ZRANGEBYSCORE', K_LEASES, '-inf', now)
  for _, id in ipairs(ids) do
    local n = tonumber(id)
    if not n then
      corrupt(K_LEASES, 'lease id is not a number')
    end
    end_lease(n)
  end
  return now
end

-- Whether lease `id` is alive (after reaping).
local function lease_alive(id)
  return call('ZSCORE', K_LEASES, s(id)) ~= false
end

-- Every operation but `init` starts here: the epoch must be the one the client attached
-- to (otherwise the server lost or replaced our data), the counters must be ours, and
-- expired leases are reaped before anything is read.
--
-- A counter below what this client has already seen means the server went back in time: it
-- restarted from an older RDB/AOF snapshot, or a replica that missed writes was promoted.
-- The epoch survived, but revisions and lease ids will be handed out again for different
-- writes, so a compare-and-swap on a remembered revision could match a stranger's value and
-- watches would skip the reused revisions. The operation is refused, and the namespace gets a
-- new epoch that says why, so every other client attached to the old one stops too (its next
-- call, or its reaper within a fraction of a second) instead of carrying on against a history
-- that no longer holds. New clients attach to the new epoch and start over.
-- Gives the namespace a new epoch saying it rolled back (found revision `rev`, seen SEEN_REV).
local function mark_rolled_back(rev)
  local t = call('TIME')
  call('SET', K_EPOCH, t[1] .. '.' .. t[2] .. ':rolled-back:' .. s(rev) .. ':' .. s(SEEN_REV))
end

local function prologue()
  local e = rcall(K_EPOCH, 'GET', K_EPOCH)
  if e ~= ARGV[2] then
    error({ rdzv_epoch = true, found = e or '' })
  end
  local rev = cur_rev()
  compacted()
  local lease_id = int_at(K_LEASEID, 0)
  int_at(K_LOGBYTES, 0)
  if rev < SEEN_REV or lease_id < SEEN_LEASE then
    mark_rolled_back(rev)
    error({ rdzv_rollback = true, rev = rev, seen = SEEN_REV, lease = lease_id, seen_lease = SEEN_LEASE })
  end
  rcall(K_LTTL, 'HLEN', K_LTTL)
  rcall(K_LOG, 'XLEN', K_LOG)
  rcall(K_LOGSZ, 'XLEN', K_LOGSZ)
  return reap()
end
