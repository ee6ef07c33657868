#!lua name=idempotency_9f5c7f424761
local HDR, OLD = 42, 30
local DONE, LOST, NOTFOUND = 4, 5, 7
-- The longest time the Store gives, in ms: math.MaxInt64 ns.
local MAXMS = 9223372036855

-- header checks v, a value read with redis.pcall, and returns the record's
-- version, state and header size, or nil and why it cannot be read. An
-- error other than WRONGTYPE is raised as Redis gave it.
local function header(v)
  if type(v) ~= 'string' then
    local e = tostring(v.err)
    if string.sub(e, 1, 9) ~= 'WRONGTYPE' then error(v) end
    return nil, e
  end
  if #v < OLD then return nil, 'truncated record header (' .. #v .. ' bytes)' end
  local ver, st = string.byte(v, 1, 2)
  if ver < 1 or ver > 3 then return nil, 'unknown record version ' .. ver end
  local h = OLD
  if ver == 3 then
    h = HDR
    if #v < HDR then return nil, 'truncated record header (' .. #v .. ' bytes)' end
  end
  if st < 1 or st > 3 then return nil, 'unknown record state ' .. st end
  if st ~= 2 and #v ~= h + struct.unpack('>I4', v, 27) then
    return nil, 'malformed record in state ' .. st
  end
  return ver, st, h
end

-- raise raises an error that redis.pcall returned, but WRONGTYPE, which
-- header reports as a corrupt record.
local function raise(v)
  if type(v) == 'table' and v.err then header(v) end
end

-- settle answers a call that did not find the record in flight with its
-- token: its own effect, when the call was sent twice (the record's first
-- 18 bytes, version to nonce, are those of mine); a lost lease; or a
-- corrupt record.
local function settle(v, mine)
  if not v then return LOST end
  local ver, why = header(v)
  if not ver then return {0, why} end
  if mine and string.sub(v, 1, 18) == string.sub(mine, 1, 18) then return DONE end
  return LOST
end

local function now()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

-- The claim's slow path: the Store sends SET NX PX GET first (see
-- Store.Claim), and calls this when it found a record that is not
-- completed. ARGV: the in-flight record to write, with the token this call
-- proposes, its nonce and the time of the claim, and abandoned 0; its
-- expiry (ms).
local function claim(keys, args)
  local key, rec, px = keys[1], args[1], args[2]
  local v = redis.pcall('SET', key, rec, 'NX', 'PX', px, 'GET')
  if not v then return {1, (struct.unpack('>i8', rec, 3)), 0, (struct.unpack('>i8', rec, 35))} end
  if type(v) == 'string' then
    local ver, st = string.byte(v, 1, 2)
    if st == 2 and ver >= 1 and ver <= 3 then return v end
  end
  local ver, st, h = header(v)
  if not ver then return {0, st} end
  local prev = (struct.unpack('>i8', v, 3))
  local ab, created = 0, (struct.unpack('>i8', rec, 35))
  if st == 1 then
    if ver == 3 then ab, created = struct.unpack('>I4i8', v, 31) end
    local held, left = string.sub(v, h + 1), nil
    if ver ~= 1 then
      -- This very claim, sent again after its reply was lost.
      if ver == 3 and string.sub(v, 11, 18) == string.sub(rec, 11, 18) then
        return {1, prev, ab, created}
      end
      left = redis.call('PTTL', key) - struct.unpack('>i8', v, 19)
    else
      local t = redis.call('TIME')
      left = math.ceil((struct.unpack('>i8', v, 11) - t[1] * 1000000 - t[2]) / 1000)
    end
    if left > 0 then return {2, held, left} end
    if held ~= string.sub(rec, HDR + 1) then return {2, held, 0} end
    -- An expired lease: its holder abandoned the record.
    ab = ab + 1
  end
  -- Released, or a lease that expired: take over with a larger token.
  local tok = math.max(prev + 1, (struct.unpack('>i8', rec, 3)))
  redis.call('SET', key, string.sub(rec, 1, 2) .. struct.pack('>i8', tok) .. string.sub(rec, 11, 30) ..
    struct.pack('>I4i8', ab, created) .. string.sub(rec, HDR + 1), 'PX', px)
  return {1, tok, ab, created}
end

-- ARGV: the in-flight record's first 10 bytes; the completed record, with
-- this call's nonce and the fingerprint, abandoned count and time that the
-- Store remembers, if any; the expiry (ms).
local function complete(keys, args)
  local key, cur, rec = keys[1], args[1], args[2]
  local v = redis.pcall('GET', key)
  raise(v)
  if type(v) == 'string' and #v >= HDR and string.sub(v, 1, 10) == cur
    and #v == HDR + struct.unpack('>I4', v, 27) then
    if string.sub(rec, 27, #v) ~= string.sub(v, 27) then
      -- Not the record's fingerprint: splice the record's in.
      rec = string.sub(rec, 1, 26) .. string.sub(v, 27) ..
        string.sub(rec, HDR + 1 + struct.unpack('>I4', rec, 27))
    end
    redis.call('SET', key, rec, 'PX', args[3])
    return DONE
  end
  return settle(v, rec)
end

-- ARGV: the in-flight record's first 10 bytes; the tombstone to write,
-- which keeps the token, with this call's nonce. It keeps the record's
-- expiry too, so that the next lease's token is larger. A record that the
-- holder took over from lost holders (abandoned > 0) is not made a
-- tombstone: it goes back to how the takeover found it, in flight with its
-- lease over (its slack all that is left of its life), one holder fewer
-- counted, which the next takeover counts again, and the next token, which
-- no holder has.
local function release(keys, args)
  local key, cur, tomb = keys[1], args[1], args[2]
  local v = redis.pcall('GET', key)
  raise(v)
  if type(v) == 'string' and #v >= HDR and string.sub(v, 1, 10) == cur then
    local ab = struct.unpack('>I4', v, 31)
    if ab == 0 then
      redis.call('SET', key, tomb, 'KEEPTTL')
      return DONE
    end
    redis.call('SET', key, string.sub(v, 1, 2) .. struct.pack('>i8', struct.unpack('>i8', v, 3) + 1) ..
      string.sub(tomb, 11, 18) .. struct.pack('>i8', redis.call('PTTL', key)) .. string.sub(v, 27, 30) ..
      struct.pack('>I4', ab - 1) .. string.sub(v, 35), 'KEEPTTL')
    return DONE
  end
  -- This very release, sent again after its reply was lost.
  if type(v) == 'string' and #v >= HDR and string.byte(v, 1) == 3 and string.byte(v, 2) == 1
    and string.sub(v, 11, 18) == string.sub(tomb, 11, 18) then
    return DONE
  end
  return settle(v, tomb)
end

-- ARGV: the in-flight record's first 10 bytes; the lease (ms). The record
-- expires when the lease ends, and then its slack, the TTL that the claim
-- gave it: the slack stays, or grows when the lease is shortened, so that
-- the expiry never comes sooner.
local function extend(keys, args)
  local key, cur, lease = keys[1], args[1], tonumber(args[2])
  local v = redis.pcall('GET', key)
  raise(v)
  if type(v) == 'string' and #v >= HDR and string.sub(v, 1, 10) == cur then
    local pttl = redis.call('PTTL', key)
    local slack = struct.unpack('>i8', v, 19)
    if slack < 0 or slack > MAXMS then return {0, 'malformed record slack ' .. slack} end
    local px = math.max(pttl, lease + slack)
    redis.call('SETRANGE', key, 18, struct.pack('>i8', px - lease))
    if px > pttl then redis.call('PEXPIRE', key, px) end
    return DONE
  end
  return settle(v, nil)
end

-- The record whole, with its PTTL and the server's time, for an operator.
local function lookup(keys, args)
  local key = keys[1]
  local v = redis.pcall('GET', key)
  if not v then return NOTFOUND end
  local ver, st = header(v)
  if not ver then return {0, st} end
  if st == 3 then return NOTFOUND end
  return {6, v, redis.call('PTTL', key), (now())}
end

-- ARGV: a completed record with this call's nonce, no fingerprint and the
-- response, and its expiry (ms); or a tombstone. Either takes the record's
-- token, so that its holder's is refused; a completed one keeps the
-- record's fingerprint, abandoned count and time.
local function resolve(keys, args)
  local key, rec = keys[1], args[1]
  local v = redis.pcall('GET', key)
  if not v then return NOTFOUND end
  local ver, st, h = header(v)
  if not ver then return {0, st} end
  if st == 3 then return NOTFOUND end
  local head = string.sub(rec, 1, 2) .. string.sub(v, 3, 10) .. string.sub(rec, 11, 26)
  if string.byte(rec, 2) == 3 then
    redis.call('SET', key, head .. string.sub(rec, 27), 'KEEPTTL')
    return DONE
  end
  local n = struct.unpack('>I4', v, 27)
  local ab, created = 0, 0
  if ver == 3 then ab, created = struct.unpack('>I4i8', v, 31) end
  redis.call('SET', key, head .. struct.pack('>I4I4i8', n, ab, created) ..
    string.sub(v, h + 1, h + n) .. string.sub(rec, HDR + 1), 'PX', args[2])
  return DONE
end

redis.register_function('idempotency_9f5c7f424761_claim', claim)
redis.register_function('idempotency_9f5c7f424761_complete', complete)
redis.register_function('idempotency_9f5c7f424761_release', release)
redis.register_function('idempotency_9f5c7f424761_extend', extend)
redis.register_function('idempotency_9f5c7f424761_lookup', lookup)
redis.register_function('idempotency_9f5c7f424761_resolve', resolve)
