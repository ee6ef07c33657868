package redisstore

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// The Store's operations are Redis Functions, one per operation, in one
// library. Each reads and writes KEYS[1] only, the record's key, so it is
// atomic and runs on whichever Cluster node owns that key. None reads the
// clock: an in-flight record's lease is its expiry less its slack (see
// record.go), judged by the server's own PTTL; the token of a new lease is
// proposed by the caller (see Store.Claim). Only a lease kept in a version 1
// record, which holds the end of the lease as a time, is judged by TIME.
//
// Redis hashes every byte of every Lua string it makes (its Lua computes a
// string's hash over all of it), and each command a function calls costs
// about as much as a small command from a client: so the functions make few
// strings, small ones, and call few commands. The fast path of each is a
// command or two and a comparison of bytes built in Go: the claim of a new
// key is SET NX PX GET of an in-flight record built in Go, and the replay is
// that same command, which returns the completed record without writing;
// Complete, Release and Extend compare the record's first ten bytes
// (version, state, token) with what the holder's token makes, and Complete
// writes the completed record as Go built it (see fingerprints.go).
// Everything else (a claim sent twice, a takeover, a lost lease, a corrupt
// record, a record of the previous layout) is the slow path.
//
// The replies, told apart by their type:
const (
	// Claim: 1 is acquired, with the token that the call proposed; a string
	// is the completed record, whole; arrays are coded.
	replyAcquired = 1 // 1, or {1, token}
	replyInFlight = 2 // {2, fingerprint, ms left on the lease}
	replyCorrupt  = 0 // {0, why}, from every function
	// Complete, Release, Extend.
	replyDone      = 4
	replyLeaseLost = 5
)

// libraryTemplate is the library's code; {{lib}} stands for its name, which
// holds a digest of the code, so that Stores of different releases that
// share a Redis each call the functions they were written for. Loading a
// library of that name again (FUNCTION LOAD REPLACE) changes nothing.
const libraryTemplate = `#!lua name={{lib}}
local HDR = 30
local DONE, LOST = 4, 5

-- header checks v, a value read with redis.pcall, and returns the record's
-- version and state, or nil and why it cannot be read.
local function header(v)
  if type(v) ~= 'string' then return nil, tostring(v.err) end
  if #v < HDR then return nil, 'truncated record header (' .. #v .. ' bytes)' end
  local ver, st = string.byte(v, 1, 2)
  if ver ~= 1 and ver ~= 2 then return nil, 'unknown record version ' .. ver end
  if st < 1 or st > 3 then return nil, 'unknown record state ' .. st end
  if st ~= 2 and #v ~= HDR + struct.unpack('>I4', v, 27) then
    return nil, 'malformed record in state ' .. st
  end
  return ver, st
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

-- ARGV: the in-flight record to write, with the token this call proposes
-- and its nonce; its expiry (ms).
local function claim(keys, args)
  local key, rec, px = keys[1], args[1], args[2]
  local v = redis.pcall('SET', key, rec, 'NX', 'PX', px, 'GET')
  if not v then return 1 end
  if type(v) == 'string' then
    local ver, st = string.byte(v, 1, 2)
    if st == 2 and (ver == 2 or ver == 1) then return v end
  end
  local ver, st = header(v)
  if not ver then return {0, st} end
  local prev = (struct.unpack('>i8', v, 3))
  if st == 1 then
    local held, left = string.sub(v, HDR + 1), nil
    if ver == 2 then
      -- This very claim, sent again after its reply was lost.
      if string.sub(v, 11, 18) == string.sub(rec, 11, 18) then return {1, prev} end
      left = redis.call('PTTL', key) - struct.unpack('>i8', v, 19)
    else
      local t = redis.call('TIME')
      left = math.ceil((struct.unpack('>i8', v, 11) - t[1] * 1000000 - t[2]) / 1000)
    end
    if left > 0 then return {2, held, left} end
    if held ~= string.sub(rec, HDR + 1) then return {2, held, 0} end
  end
  -- Released, or a lease that expired: take over with a larger token.
  local tok = math.max(prev + 1, (struct.unpack('>i8', rec, 3)))
  redis.call('SET', key, string.sub(rec, 1, 2) .. struct.pack('>i8', tok) .. string.sub(rec, 11), 'PX', px)
  return {1, tok}
end

-- ARGV: the in-flight record's first 10 bytes; the completed record, with
-- this call's nonce and the fingerprint that the Store remembers, if any;
-- the expiry (ms).
local function complete(keys, args)
  local key, cur, rec = keys[1], args[1], args[2]
  local v = redis.pcall('GET', key)
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
-- expiry too, so that the next lease's token is larger.
local function release(keys, args)
  local key, cur, tomb = keys[1], args[1], args[2]
  local v = redis.pcall('GET', key)
  if type(v) == 'string' and #v >= HDR and string.sub(v, 1, 10) == cur then
    redis.call('SET', key, tomb, 'KEEPTTL')
    return DONE
  end
  return settle(v, tomb)
end

-- ARGV: the in-flight record's first 10 bytes; the lease (ms). The record
-- expires when the lease ends or later: its slack is the difference.
local function extend(keys, args)
  local key, cur, lease = keys[1], args[1], tonumber(args[2])
  local v = redis.pcall('GET', key)
  if type(v) == 'string' and #v >= HDR and string.sub(v, 1, 10) == cur then
    local pttl = redis.call('PTTL', key)
    local px = math.max(pttl, lease)
    redis.call('SETRANGE', key, 18, struct.pack('>i8', px - lease))
    if px > pttl then redis.call('PEXPIRE', key, px) end
    return DONE
  end
  return settle(v, nil)
end

redis.register_function('{{lib}}_claim', claim)
redis.register_function('{{lib}}_complete', complete)
redis.register_function('{{lib}}_release', release)
redis.register_function('{{lib}}_extend', extend)
`

// library is the library's code and the names of its functions.
type library struct {
	name, code                       string
	claim, complete, release, extend string
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
	}
}
