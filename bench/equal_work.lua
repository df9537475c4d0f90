#!lua name=sharecoord_equal_work
-- The equal-work Redis peer: what sharecoord does per write, as a Redis 7 function library.
--
-- One string key per share-partition holds, msgpack-encoded, the flat array
--   snapshot_epoch, state_epoch, leader_epoch, start_offset, delivery_complete_count,
--   leader_fence, state_fence, update_count (-1: none yet), then first, last, state,
--   count of each state batch.
-- One GET and one SET per share-partition, and a value about as small as sharecoord's
-- record. Offsets are Lua numbers (doubles): exact up to 2^53, plenty for the benchmark.
--
-- @RECORDS_PER_SNAPSHOT@ is sharecoord's snapshot cadence (docs/semantics.md §6),
-- substituted on load: a snapshot and an update merge several new batches differently
-- (§A.1 point 14), so the peer counts updates as sharecoord's replay does.

local RECORDS_PER_SNAPSHOT = @RECORDS_PER_SNAPSHOT@
local STEP_LIMIT = 100000
local HEADER = 8

-- Kafka's set order: first, last, count, then state.
local function before(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] end
  if a[2] ~= b[2] then return a[2] < b[2] end
  if a[4] ~= b[4] then return a[4] < b[4] end
  return a[3] < b[3]
end

-- Into the set (the part of `set` from `head` on), an identical batch only once.
local function insert(set, head, piece)
  local i = head
  local n = #set
  while i <= n and before(set[i], piece) do i = i + 1 end
  local there = set[i]
  if there and there[1] == piece[1] and there[2] == piece[2]
      and there[3] == piece[3] and there[4] == piece[4] then
    return
  end
  table.insert(set, i, piece)
end

-- docs/semantics.md §7 step 6: the pieces that replace a mergeable pair.
local function resolve(p, c)
  if p[3] == c[3] and p[4] == c[4] then
    return { { p[1], math.max(p[2], c[2]), p[3], p[4] } }
  end
  local cand_higher = c[4] > p[4] or (c[4] == p[4] and c[3] > p[3])
  if c[1] == p[1] then
    if c[2] == p[2] or cand_higher then return { c } end
    return { p, { p[2] + 1, c[2], c[3], c[4] } }
  end
  if not cand_higher then
    if c[2] <= p[2] then return { p } end
    return { p, { p[2] + 1, c[2], c[3], c[4] } }
  end
  if c[2] < p[2] then
    return { { p[1], c[1] - 1, p[3], p[4] }, c, { c[2] + 1, p[2], p[3], p[4] } }
  end
  return { { p[1], c[1] - 1, p[3], p[4] }, c }
end

-- docs/semantics.md §7, step for step. Batches come and go as flat arrays from index
-- `from` on (4 numbers each); the set is a sorted array whose live part starts at `head`.
local function combine(current, current_from, new, new_from, start_offset)
  local batches = {}
  local function take(flat, from)
    for i = from, #flat, 4 do
      local f, l = flat[i], flat[i + 1]
      -- Step 2: -1 means no pruning.
      if start_offset == -1 or l >= start_offset then
        if start_offset ~= -1 and f < start_offset then f = start_offset end
        batches[#batches + 1] = { f, l, flat[i + 2], flat[i + 3] }
      end
    end
  end
  take(current, current_from)
  take(new, new_from)
  local out = {}
  if #batches >= 2 then
    -- Step 4.
    local set = {}
    for _, b in ipairs(batches) do insert(set, 1, b) end
    local head = 1
    local steps = 0
    while true do
      -- Step 5: every prev that does not pair with its successor is final.
      local p, c
      local found = false
      while head < #set do
        p, c = set[head], set[head + 1]
        if c[1] <= p[2] or (c[1] == p[2] + 1 and c[3] == p[3] and c[4] == p[4]) then
          found = true
          break
        end
        out[#out + 1] = p
        head = head + 1
      end
      if not found then
        for i = head, #set do out[#out + 1] = set[i] end
        break
      end
      -- Step 6: the pair leaves the set, its pieces go back in.
      head = head + 2
      for _, piece in ipairs(resolve(p, c)) do insert(set, head, piece) end
      -- Kafka's walk never ends on some inverted input (first > last); sharecoord
      -- refuses it (§A.1 point 15), and so does this, by counting.
      steps = steps + 1
      if steps > STEP_LIMIT then
        error('share_combine: inverted batches make the merge cycle')
      end
    end
  else
    -- Step 3: fewer than two batches come back as they are.
    out = batches
  end
  local flat = {}
  for _, b in ipairs(out) do
    flat[#flat + 1] = b[1]; flat[#flat + 1] = b[2]
    flat[#flat + 1] = b[3]; flat[#flat + 1] = b[4]
  end
  return flat
end

-- docs/semantics.md §5.3 and §6 for one key: fence, then one snapshot or one update,
-- applied as sharecoord's replay applies it (§4). `args[at]` on: state_epoch,
-- leader_epoch, start_offset, delivery_complete_count, batch count, the batches.
-- Returns the error code and where the next entry's arguments start.
local function write_one(key, args, at)
  local state_epoch, leader_epoch = tonumber(args[at]), tonumber(args[at + 1])
  local start_offset, dcc = tonumber(args[at + 2]), tonumber(args[at + 3])
  local width = 4 * tonumber(args[at + 4])
  local new = {}
  for i = 1, width do new[i] = tonumber(args[at + 4 + i]) end
  local next_at = at + 5 + width
  local raw = redis.call('GET', key)
  if not raw then return 42, next_at end
  local st = cmsgpack.unpack(raw)
  if leader_epoch ~= -1 and st[6] > leader_epoch then return 74, next_at end
  if state_epoch ~= -1 and st[7] > state_epoch then return 124, next_at end
  local new_start = start_offset
  if start_offset == -1 then new_start = st[4] end
  local count = st[8]
  local merged
  if math.max(count, 0) >= RECORDS_PER_SNAPSHOT then
    -- A snapshot: stored and new batches merged in one pass; it resets a counter that
    -- reached the limit (§4.4).
    merged = combine(st, HEADER + 1, new, 1, new_start)
    st[1] = st[1] + 1
    if count ~= -1 then count = 0 end
  else
    -- An update carries the new batches merged among themselves at the request's start
    -- offset; replay merges that into the stored ones (§4.7).
    merged = combine(st, HEADER + 1, combine({}, 1, new, 1, start_offset), 1, new_start)
    -- -1 (no update yet) becomes 0: the first update counts 0 (§16.5).
    count = count + 1
  end
  local value = { st[1], st[2], st[3], new_start, st[5], st[6], st[7], count }
  if dcc ~= -1 then value[5] = dcc end
  for i = 1, #merged do value[HEADER + i] = merged[i] end
  redis.call('SET', key, cmsgpack.pack(value))
  return 0, next_at
end

local function write_many(keys, args)
  local codes = {}
  local at = 1
  for i, key in ipairs(keys) do
    codes[i], at = write_one(key, args, at)
  end
  return codes
end

-- One key; answers its error code.
local function share_write(keys, args)
  local code = write_one(keys[1], args, 1)
  return code
end

-- docs/semantics.md §5.1 for every key given: args are state_epoch and start_offset.
local function share_initialize(keys, args)
  local state_epoch, start_offset = tonumber(args[1]), tonumber(args[2])
  local dcc = 0
  if start_offset == -1 then dcc = -1 end
  local codes = {}
  for i, key in ipairs(keys) do
    local raw = redis.call('GET', key)
    local value
    if not raw then
      value = { 0, state_epoch, 0, start_offset, dcc, 0, state_epoch, -1 }
    else
      local st = cmsgpack.unpack(raw)
      if state_epoch ~= -1 and st[7] > state_epoch then
        codes[i] = 124
      else
        local count = st[8]
        if count >= RECORDS_PER_SNAPSHOT then count = 0 end
        value = { st[1] + 1, state_epoch, 0, start_offset, dcc, math.max(st[6], 0),
                  math.max(st[7], state_epoch), count }
      end
    end
    if value then
      redis.call('SET', key, cmsgpack.pack(value))
      codes[i] = 0
    end
  end
  return codes
end

-- The combiner alone, for the tests that hold it against sharecoord's: args are
-- start_offset, the number of current batches, then current and new batches, flat.
local function share_combine(_, args)
  local numbers = {}
  for i = 1, #args do numbers[i] = tonumber(args[i]) end
  local current_width = 4 * numbers[2]
  local current = {}
  for i = 1, current_width do current[i] = numbers[2 + i] end
  return combine(current, 1, numbers, 3 + current_width, numbers[1])
end

redis.register_function('share_write', share_write)
redis.register_function('share_write_many', write_many)
redis.register_function('share_initialize', share_initialize)
redis.register_function{
  function_name = 'share_combine', callback = share_combine, flags = { 'no-writes' }
}
