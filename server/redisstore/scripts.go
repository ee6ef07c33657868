package redisstore

// The Lua scripts, one per Store operation. Each reads and writes KEYS[1]
// only, the record's key, so it is atomic and runs on whichever Cluster node
// owns that key. Times come from the Redis server's clock (TIME), so that
// every API instance judges leases alike; writes after TIME are allowed
// because Redis 7 replicates a script's effects, not the script.
//
// Every script answers an array whose first element is one of the reply
// codes below; a record that cannot be read is answered {0, why}, never an
// error reply, so that Go tells it apart without matching error strings.
const (
	replyCorrupt   = 0 // {0, why}
	replyAcquired  = 1 // {1, token}
	replyInFlight  = 2 // {2, fingerprint, µs left on the lease}
	replyCompleted = 3 // {3, record}
	replyDone      = 4 // {4}
	replyLeaseLost = 5 // {5}
)

// luaPrelude is shared by the scripts. header parses the fixed part of a
// record (see record.go for the layout) and returns nil and a reason when it
// cannot; load reads the record, or its header only when the script needs no
// more: false when there is none, nil and a reason when it is corrupt.
const luaPrelude = `
local HDR = 30
local FMT = '>BBi8i8c8I4'
local function header(v)
  if #v < HDR then return nil, 'truncated record header (' .. #v .. ' bytes)' end
  local ver, st, tok, lu, nonce, fplen = struct.unpack(FMT, v)
  if ver ~= 1 then return nil, 'unknown record version ' .. ver end
  if st < 1 or st > 3 then return nil, 'unknown record state ' .. st end
  return {st = st, tok = tok, lu = lu, nonce = nonce, fplen = fplen}
end
local function load(key, whole)
  local v
  if whole then
    v = redis.pcall('GET', key)
  else
    v = redis.pcall('GETRANGE', key, 0, HDR - 1)
    if v == '' and redis.call('EXISTS', key) == 0 then v = false end
  end
  if type(v) == 'table' then return nil, nil, v.err end
  if not v then return false end
  local h, why = header(v)
  if not h then return nil, nil, why end
  if whole and h.st == 1 and #v ~= HDR + h.fplen then
    return nil, nil, 'malformed in-flight record'
  end
  return h, v
end
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- Tokens are below 2^53, exact in a Lua number; '%.0f' prints them whole
-- where tostring would print 1.7e+15.
local function tokstr(n) return string.format('%.0f', n) end
`

// claimLua: ARGV fingerprint, nonce, lease (µs), record expiry (ms).
//
// A record in flight whose nonce is this call's is this very claim, sent
// again by the client after a lost reply: it is answered as acquired, with
// the token it got, instead of as its own in-flight rival.
const claimLua = luaPrelude + `
local key, fp, nonce, lease, px = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local h, v, why = load(key, true)
if h == nil then return {0, why} end
if h and h.st == 2 then return {3, v} end
local prev = 0
local now = now_us()
if h then
  if h.st == 1 then
    if h.nonce == nonce then return {1, tokstr(h.tok)} end
    local held = string.sub(v, HDR + 1)
    if now < h.lu then return {2, held, h.lu - now} end
    if held ~= fp then return {2, held, 0} end
  end
  prev = h.tok
end
local tok = math.max(prev + 1, now)
redis.call('SET', key, struct.pack(FMT, 1, 1, tok, now + lease, nonce, #fp) .. fp, 'PX', px)
return {1, tokstr(tok)}
`

// completeLua: ARGV token, nonce, encoded response, record expiry (ms).
const completeLua = luaPrelude + `
local key, token, nonce, resp, px = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local h, v, why = load(key, true)
if h == nil then return {0, why} end
if not h or tokstr(h.tok) ~= token then return {5} end
if h.st == 2 and h.nonce == nonce then return {4} end
if h.st ~= 1 then return {5} end
redis.call('SET', key, struct.pack(FMT, 1, 2, h.tok, 0, nonce, h.fplen) .. string.sub(v, HDR + 1) .. resp, 'PX', px)
return {4}
`

// releaseLua: ARGV token, nonce. The record becomes a tombstone that keeps
// the token, and the record's expiry, so that the next lease's token is
// larger.
const releaseLua = luaPrelude + `
local key, token, nonce = KEYS[1], ARGV[1], ARGV[2]
local h, v, why = load(key, false)
if h == nil then return {0, why} end
if not h or tokstr(h.tok) ~= token then return {5} end
if h.st == 3 and h.nonce == nonce then return {4} end
if h.st ~= 1 then return {5} end
redis.call('SET', key, struct.pack(FMT, 1, 3, h.tok, 0, nonce, 0), 'KEEPTTL')
return {4}
`

// extendLua: ARGV token, lease (µs), lease (ms). Only the lease end is
// rewritten; the record lives at least as long as the lease.
const extendLua = luaPrelude + `
local key, token, lease, leasems = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local h, v, why = load(key, false)
if h == nil then return {0, why} end
if not h or h.st ~= 1 or tokstr(h.tok) ~= token then return {5} end
-- The lease end is the 8 bytes at offset 10.
redis.call('SETRANGE', key, 10, struct.pack('>i8', now_us() + lease))
if redis.call('PTTL', key) < leasems then redis.call('PEXPIRE', key, leasems) end
return {4}
`
