package redisstore

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// The Store's operations are Redis Functions, one per operation, in one
// library, but for the common path of a claim, which is a plain command (see
// [Store.Claim]). Each reads and writes KEYS[1], the record's key, and, only
// when the record holds steps (state 4) or SaveStep records the first one,
// the record's steps key, which the Store names in an argument and puts in
// the record's Cluster slot (see steps.go): so each is atomic and runs on
// whichever Cluster node owns the record. The steps key is not declared as
// a key: a call that declared two keys would be refused (TRYAGAIN) while
// the slot migrates and only one of them exists, which is every record
// without steps. No lease is
// judged by a clock: an in-flight record's lease is its expiry less its
// slack (see record.go), judged by the server's own PTTL; the token of a new
// lease, and the time of the claim, are proposed by the caller. Only a lease
// kept in a version 1 record, which holds the end of the lease as a time,
// is judged by TIME; and Lookup reads TIME to tell an operator how long a
// record has left.
//
// Redis hashes every byte of every Lua string it makes (its Lua computes a
// string's hash over all of it), and each command a function calls costs
// about as much as a small command from a client: so the functions make few
// strings, small ones, and call few commands. The claim of a new key is SET
// NX PX GET of an in-flight record built in Go, sent by the Store itself,
// and the replay is that same command, which returns the completed record
// without writing; only a claim that finds a record in flight or released
// calls the claim function. Complete, Release and Extend compare the
// record's first ten bytes (version, state, token) with what the holder's
// token makes, and Complete writes the completed record as Go built it (see
// fingerprints.go). Everything else (a claim sent twice, a takeover, a lost
// lease, a corrupt record, a record of the previous layout) is the slow
// path.
//
// The replies, told apart by their type:
const (
	// Claim: a string is the completed record, whole; arrays are coded.
	replyAcquired = 1 // {1, token, abandoned, created (ms)}
	replyInFlight = 2 // {2, fingerprint, ms left on the lease}
	replyCorrupt  = 0 // {0, why}, from every function
	// Complete, Release, Extend, Resolve, and SaveStep's step.
	replyDone      = 4
	replyLeaseLost = 5
	// Lookup: {6, record, PTTL (ms), the server's time (ms)}; Lookup and
	// Resolve: 7 when there is no live record.
	replyFound    = 6
	replyNotFound = 7
	// SaveStep's step: the record holds steps.MaxSteps steps already.
	replyTooMany = 8
	// An acquired claim, and Lookup, of a record that holds steps add a
	// last element: its steps, as HGETALL answers.
)

// libraryTemplate is the library's code; {{lib}} stands for its name, which
// holds a digest of the code, so that Stores of different releases that
// share a Redis each call the functions they were written for. Loading a
// library of that name again (FUNCTION LOAD REPLACE) changes nothing.
//
// A command that Redis refuses (NOPERM from the user's ACL, OOM from a full
// Redis) is raised as Redis's own error, never reported as a corrupt record:
// only a key that holds something else (WRONGTYPE) or bytes that do not
// parse are.
const libraryTemplate = `#!lua name={{lib}}
local HDR, OLD = 42, 30
local DONE, LOST, NOTFOUND, TOOMANY = 4, 5, 7, 8
-- The longest time the Store gives, in ms: math.MaxInt64 ns.
local MAXMS = 9223372036855
-- The abandoned count of a record that holds steps after the release of
-- the holder that created it: -1, which the next takeover makes 0.
local MINUS1 = 4294967295

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
  if st < 1 or st > 4 or (st == 4 and ver ~= 3) then return nil, 'unknown record state ' .. st end
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

-- held returns the state of v, 1 or 4 (in flight, holding steps), when v
-- is a record in flight with the token of cur, the first ten bytes of a
-- record in flight with it (version, state 1, token); false otherwise.
local function held(v, cur)
  if type(v) ~= 'string' or #v < HDR then return false end
  if string.sub(v, 1, 10) == cur then return 1 end
  if string.byte(v, 2) == 4 and string.byte(v, 1) == 3 and string.sub(v, 3, 10) == string.sub(cur, 3, 10) then
    return 4
  end
  return false
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

-- The steps key holds a record's steps, a hash of name to step, while the
-- record is in state 4, and expires when the record does.

-- steps returns r, the answer of a command on a steps key read with
-- redis.pcall, or nil and why a key of another type cannot be read.
local function steps(r)
  if type(r) == 'table' and r.err then
    local _, why = header(r)
    return nil, 'steps: ' .. why
  end
  return r
end

-- expireWith gives the steps key skey the record's expiry, to the
-- millisecond.
local function expireWith(skey, key)
  local at = redis.call('PEXPIRETIME', key)
  if at > 0 then redis.call('PEXPIREAT', skey, at) end
end

-- The claim's slow path: the Store sends SET NX PX GET first (see
-- Store.Claim), and calls this when it found a record that is not
-- completed. ARGV: the in-flight record to write, with the token this call
-- proposes, its nonce and the time of the claim, and abandoned 0; its
-- expiry (ms); the steps key. A record that holds steps is taken over with
-- them, and they come back with the lease.
local function claim(keys, args)
  local key, rec, px, skey = keys[1], args[1], args[2], args[3]
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
  local kept
  if st == 1 or st == 4 then
    if ver == 3 then ab, created = struct.unpack('>I4i8', v, 31) end
    local fp, left = string.sub(v, h + 1), nil
    if ver ~= 1 then
      -- This very claim, sent again after its reply was lost.
      if ver == 3 and string.sub(v, 11, 18) == string.sub(rec, 11, 18) then
        if st == 4 then
          local s, why = steps(redis.pcall('HGETALL', skey))
          if not s then return {0, why} end
          return {1, prev, ab, created, s}
        end
        return {1, prev, ab, created}
      end
      left = redis.call('PTTL', key) - struct.unpack('>i8', v, 19)
    else
      local t = redis.call('TIME')
      left = math.ceil((struct.unpack('>i8', v, 11) - t[1] * 1000000 - t[2]) / 1000)
    end
    if left > 0 then return {2, fp, left} end
    if fp ~= string.sub(rec, HDR + 1) then return {2, fp, 0} end
    if st == 4 then
      local why
      kept, why = steps(redis.pcall('HGETALL', skey))
      if not kept then return {0, why} end
      -- Steps that are gone (deleted by hand) leave a record without.
      if #kept == 0 then kept = nil end
      if ab == MINUS1 then ab = -1 end
    end
    -- An expired lease: its holder abandoned the record.
    ab = ab + 1
  end
  -- Released, or a lease that expired: take over with a larger token.
  local tok = math.max(prev + 1, (struct.unpack('>i8', rec, 3)))
  redis.call('SET', key, string.sub(rec, 1, 1) .. (kept and '\4' or '\1') .. struct.pack('>i8', tok) ..
    string.sub(rec, 11, 30) .. struct.pack('>I4i8', ab, created) .. string.sub(rec, HDR + 1), 'PX', px)
  if kept then
    expireWith(skey, key)
    return {1, tok, ab, created, kept}
  end
  return {1, tok, ab, created}
end

-- ARGV: the in-flight record's first 10 bytes; the completed record, with
-- this call's nonce and the fingerprint, abandoned count and time that the
-- Store remembers, if any; the expiry (ms); the steps key, which goes with
-- the lease.
local function complete(keys, args)
  local key, cur, rec = keys[1], args[1], args[2]
  local v = redis.pcall('GET', key)
  raise(v)
  local st = held(v, cur)
  if st and #v == HDR + struct.unpack('>I4', v, 27) then
    if string.sub(rec, 27, #v) ~= string.sub(v, 27) then
      -- Not the record's fingerprint: splice the record's in.
      rec = string.sub(rec, 1, 26) .. string.sub(v, 27) ..
        string.sub(rec, HDR + 1 + struct.unpack('>I4', rec, 27))
    end
    if st == 4 then redis.call('DEL', args[4]) end
    redis.call('SET', key, rec, 'PX', args[3])
    return DONE
  end
  return settle(v, rec)
end

-- ARGV: the in-flight record's first 10 bytes; the tombstone to write,
-- which keeps the token, with this call's nonce; the steps key. It keeps
-- the record's expiry too, so that the next lease's token is larger. A
-- record that the holder took over from lost holders (abandoned > 0), or
-- one that holds steps, is not made a tombstone: it goes back to how the
-- takeover found it, in flight with its lease over (its slack all that is
-- left of its life), one holder fewer counted, which the next takeover
-- counts again, and the next token, which no holder has. Its steps stay,
-- with the expiry they share with it.
local function release(keys, args)
  local key, cur, tomb = keys[1], args[1], args[2]
  local v = redis.pcall('GET', key)
  raise(v)
  local st = held(v, cur)
  if st then
    if st == 4 then
      local n, why = steps(redis.pcall('HLEN', args[3]))
      if not n then return {0, why} end
      if n == 0 then st = 1 end
    end
    local ab = struct.unpack('>I4', v, 31)
    if ab == 0 and st == 1 then
      redis.call('SET', key, tomb, 'KEEPTTL')
      return DONE
    end
    if ab == 0 then ab = MINUS1 else ab = ab - 1 end
    redis.call('SET', key, string.sub(v, 1, 1) .. string.char(st) ..
      struct.pack('>i8', struct.unpack('>i8', v, 3) + 1) ..
      string.sub(tomb, 11, 18) .. struct.pack('>i8', redis.call('PTTL', key)) .. string.sub(v, 27, 30) ..
      struct.pack('>I4', ab) .. string.sub(v, 35), 'KEEPTTL')
    return DONE
  end
  -- This very release, sent again after its reply was lost.
  if type(v) == 'string' and #v >= HDR and string.byte(v, 1) == 3 and
    (string.byte(v, 2) == 1 or string.byte(v, 2) == 4) and string.sub(v, 11, 18) == string.sub(tomb, 11, 18) then
    return DONE
  end
  return settle(v, tomb)
end

-- ARGV: the in-flight record's first 10 bytes; the lease (ms); the steps
-- key. The record expires when the lease ends, and then its slack, the TTL
-- that the claim gave it: the slack stays, or grows when the lease is
-- shortened, so that the expiry never comes sooner. Its steps expire with
-- it.
local function extend(keys, args)
  local key, cur, lease = keys[1], args[1], tonumber(args[2])
  local v = redis.pcall('GET', key)
  raise(v)
  local st = held(v, cur)
  if st then
    local pttl = redis.call('PTTL', key)
    local slack = struct.unpack('>i8', v, 19)
    if slack < 0 or slack > MAXMS then return {0, 'malformed record slack ' .. slack} end
    local px = math.max(pttl, lease + slack)
    redis.call('SETRANGE', key, 18, struct.pack('>i8', px - lease))
    if px > pttl then
      redis.call('PEXPIRE', key, px)
      if st == 4 then expireWith(args[3], key) end
    end
    return DONE
  end
  return settle(v, nil)
end

-- The record whole, with its PTTL, the server's time and its steps, for
-- an operator. ARGV: the steps key.
local function lookup(keys, args)
  local key = keys[1]
  local v = redis.pcall('GET', key)
  if not v then return NOTFOUND end
  local ver, st = header(v)
  if not ver then return {0, st} end
  if st == 3 then return NOTFOUND end
  if st == 4 then
    local s, why = steps(redis.pcall('HGETALL', args[1]))
    if not s then return {0, why} end
    return {6, v, redis.call('PTTL', key), (now()), s}
  end
  return {6, v, redis.call('PTTL', key), (now())}
end

-- ARGV: the steps key; a completed record with this call's nonce, no
-- fingerprint and the response, and its expiry (ms); or a tombstone.
-- Either takes the record's token, so that its holder's is refused; a
-- completed one keeps the record's fingerprint, abandoned count and time.
-- The steps go.
local function resolve(keys, args)
  local key, skey, rec = keys[1], args[1], args[2]
  local v = redis.pcall('GET', key)
  if not v then return NOTFOUND end
  local ver, st, h = header(v)
  if not ver then return {0, st} end
  if st == 3 then return NOTFOUND end
  if st == 4 then redis.call('DEL', skey) end
  local head = string.sub(rec, 1, 2) .. string.sub(v, 3, 10) .. string.sub(rec, 11, 26)
  if string.byte(rec, 2) == 3 then
    redis.call('SET', key, head .. string.sub(rec, 27), 'KEEPTTL')
    return DONE
  end
  local n = struct.unpack('>I4', v, 27)
  local ab, created = 0, 0
  if ver == 3 then ab, created = struct.unpack('>I4i8', v, 31) end
  if st == 4 and ab == MINUS1 then ab = 0 end
  redis.call('SET', key, head .. struct.pack('>I4I4i8', n, ab, created) ..
    string.sub(v, h + 1, h + n) .. string.sub(rec, HDR + 1), 'PX', args[3])
  return DONE
end

-- ARGV: the in-flight record's first 10 bytes; the steps key; the step's
-- name; the step as the Store encodes it, or nothing, which removes the
-- step of that name; the most steps a record holds. The record's first
-- step makes it state 4, and its last one removed state 1 again.
local function step(keys, args)
  local key, cur, skey, name, val = keys[1], args[1], args[2], args[3], args[4]
  local v = redis.pcall('GET', key)
  raise(v)
  local st = held(v, cur)
  if not st then return settle(v, nil) end
  if val == '' then
    if st == 4 then
      local n, why = steps(redis.pcall('HDEL', skey, name))
      if not n then return {0, why} end
      if redis.call('HLEN', skey) == 0 then redis.call('SETRANGE', key, 1, '\1') end
    end
    return DONE
  end
  if st == 1 then
    -- Whatever an earlier record of the key, deleted by hand, left.
    redis.call('DEL', skey)
  else
    local n, why = steps(redis.pcall('HLEN', skey))
    if not n then return {0, why} end
    if n >= tonumber(args[5]) and redis.call('HEXISTS', skey, name) == 0 then return TOOMANY end
  end
  redis.call('HSET', skey, name, val)
  expireWith(skey, key)
  if st == 1 then redis.call('SETRANGE', key, 1, '\4') end
  return DONE
end

redis.register_function('{{lib}}_claim', claim)
redis.register_function('{{lib}}_complete', complete)
redis.register_function('{{lib}}_release', release)
redis.register_function('{{lib}}_extend', extend)
redis.register_function('{{lib}}_lookup', lookup)
redis.register_function('{{lib}}_resolve', resolve)
redis.register_function('{{lib}}_step', step)
`

// library is the library's code and the names of its functions.
type library struct {
	name, code                       string
	claim, complete, release, extend string
	lookup, resolve, step            string
}

func newLibrary() library {
	sum := sha256.Sum256([]byte(libraryTemplate))
	name := "idempotency_" + hex.EncodeToString(sum[:6])
	return library{
		name:     name,
		code:     strings.ReplaceAll(libraryTemplate, "{{lib}}", name),
		claim:    name + "_claim",
		complete: name + "_complete",
		release:  name + "_release",
		extend:   name + "_extend",
		lookup:   name + "_lookup",
		resolve:  name + "_resolve",
		step:     name + "_step",
	}
}
