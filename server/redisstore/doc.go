// Package redisstore is a server.Store kept in Redis, through go-redis v9:
// for an API that runs as several processes, on a standalone Redis, behind
// Sentinel, or on a Redis Cluster.
//
// # Data layout
//
// A record is one Redis string under one key: the prefix (DefaultPrefix
// unless WithPrefix says otherwise), the scope's length in decimal, ":", the
// scope, ":", the key. The length makes the encoding injective, whatever bytes
// scope and key hold. Store.RecordKey returns it.
//
// The value is binary and versioned: a version byte, the state (in flight,
// completed, released), the fencing token, the end of the lease, a nonce, the
// fingerprint, and, once completed, the response: status, a body-omitted
// flag, headers with the order of their values kept, and the body, byte for
// byte. A record with an unknown version, or one that is truncated or
// malformed, is never replayed: Claim fails on it with ErrCorruptRecord, a
// store error, as does every other operation that reads the damaged part.
//
// # Scripts
//
// Claim, Complete, Release and Extend are each one Lua script, so each is
// one round trip (EVALSHA; the first call on a server that lacks the script
// falls back to EVAL, which loads it). A script reads and writes only the
// record's key, so it is atomic, and on a Cluster it runs on the node that
// owns that key: no operation ever spans two keys, hence two slots. The
// fencing token is checked inside the script, and lease decisions use the
// Redis server's clock (TIME), so that API instances whose clocks differ
// still agree on who holds a lease.
//
// # Tokens
//
// A new lease's token is max(previous token + 1, the server's time in
// microseconds). The previous token comes from the record: an in flight record
// whose lease expired, or the tombstone that Release leaves, which keeps the
// last token until the record would have expired. When there is no record at
// all (it expired after its TTL) the token is the time alone, larger than any
// earlier token for the ID unless the Redis server's clock went back by more
// than the time since that token was issued. Tokens taken from the clock stay
// ordered across a failover too, where a counter kept in the record would
// start again.
//
// # Expiry
//
// A record expires by Redis's own TTL: the claim sets it to the larger of
// the TTL and the lease, Complete to the TTL, Extend pushes it back to cover
// a longer lease. The end of the lease is a time kept in the record and
// compared with TIME in the scripts. There is no sweep and no goroutine.
//
// # Retries by the client
//
// go-redis sends a command again after a network error (MaxRetries), though
// the first may have run. Every call carries a random nonce that the script
// stores with its effect, so that a claim, a completion or a release sent
// twice recognises its own work: a repeated claim gets its own lease back,
// not an in-flight answer, and a repeated completion or release succeeds.
// Extend is idempotent as it is. When a call fails with a network error or a
// deadline, its effect is unknown; the record's lease and the fencing token
// settle it, never a second execution while the first still holds the lease.
//
// # What Redis guarantees, and what it does not
//
// Each operation is atomic on the Redis master. Durability and failover are
// Redis's: the store is as good as the server's configuration.
//
//   - Persistence. A Redis that restarts without AOF or RDB forgets every
//     record, and a retry of a request that already ran runs again. Run it
//     with appendonly yes; with appendfsync everysec a crash can lose the last
//     second of claims and completions.
//   - Replication is asynchronous. A failover to a replica that had not
//     received a claim loses it: a retry that reaches the new master runs the
//     request a second time, possibly while the first execution is still
//     running. A lost completion turns the record back into the claim (whose
//     lease then expires and is taken over) or loses it. So at-most-once holds
//     across a failover only for records the replica had received. The
//     fencing token limits the damage downstream: the second execution's
//     token comes from the new master's clock, so it is the larger unless
//     that clock is behind by more than the time between the two claims, and
//     a system that refuses tokens older than the largest it has seen refuses
//     the first holder's late writes.
//   - Eviction. Run the Redis with maxmemory-policy noeviction. An evicting
//     policy (allkeys-* or volatile-*, and every record has a TTL) forgets
//     live records to make room; with noeviction a full Redis refuses new
//     claims, the middleware answers 503, and nothing runs twice.
//   - A *redis.Ring is a UniversalClient too, but adding or removing one of
//     its shards moves keys, and the records on them seem gone: use a Cluster
//     to shard.
//
// # Errors
//
// Errors other than server.ErrLeaseLost are store errors: Redis unreachable,
// a script failed, a record corrupt. They start with "redisstore:" and hold
// no password: the package logs nothing and never formats the client's
// options. How soon an unreachable Redis fails a call is the client's
// configuration (MaxRetries, DialerRetries, DialTimeout; about two seconds
// with go-redis's defaults); with ContextTimeoutEnabled on the client, the
// call's context bounds it, for a Redis that hangs as well as one that is
// down.
//
// # Requirements
//
// Redis 6.0 or later (the scripts use SET KEEPTTL, TIME before writes and
// the struct library); the tests run on 7.0. A key or scope that holds a
// Cluster hash tag ("{...}") decides its record's slot, as in any Redis key:
// a client that puts one tag in all its keys puts all its records on one
// node, which costs balance, not correctness.
package redisstore
