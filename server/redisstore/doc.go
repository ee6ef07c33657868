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
// The value is binary and versioned. Version 2, which this release writes, is
// a header of 30 bytes (the version, the state: in flight, completed or
// released, the fencing token, the nonce of the call that last changed the
// state, the lease's slack, the fingerprint's length), the fingerprint, and,
// once completed, the response: status, a body-omitted flag, headers in
// increasing order of name with the order of their values kept, and the
// body, byte for byte. It holds no time. A record with an unknown version, or
// one that is truncated or malformed, is never replayed: Claim fails on it
// with ErrCorruptRecord, a store error, as does every other operation that
// reads the damaged part.
//
// Records of version 1, which earlier releases wrote, are read: a completed
// one is replayed; an in-flight one, which holds the end of its lease as a
// time, is in flight until that time by the Redis server's clock (TIME, read
// on that path only) and is then taken over into version 2; a released one
// passes its token on. Complete, Release and Extend answer server.ErrLeaseLost
// on them, since only an earlier release can hold their leases. Earlier
// releases do not read version 2: while both run against one Redis, as in a
// rolling upgrade, an instance of the earlier release answers 503 (a store
// error) for a key that this release wrote, until every instance runs this
// one.
//
// # Functions
//
// Claim, Complete, Release and Extend are each one Redis Function, called
// with FCALL: one round trip. The four are in one library whose name holds a
// digest of its code ("idempotency_" and 12 hex digits), so that Stores of
// different releases sharing a Redis each call their own. A function reads
// and writes only the record's key, so it is atomic, and on a Cluster it runs
// on the node that owns that key: no operation ever spans two keys, hence two
// slots. The fencing token is checked inside the function.
//
// New does no I/O. A call that finds a server without the library (a new
// server, one restarted without persistence, one whose functions were
// flushed, a replica promoted without them) loads it there, on the master
// that owns the key, with FUNCTION LOAD REPLACE, and calls again: a function
// that was not found has not run. That call takes three round trips; the
// next ones on that server take one. So the user the client logs in as needs
// FUNCTION LOAD and FCALL; a library of an earlier release stays on the
// server until removed with FUNCTION DELETE.
//
// Each function's common path is a command or two and a comparison of bytes
// prepared by the Store: a claim of a new key is SET NX PX GET of an in-flight
// record built by the Store, and the same command returns a completed record
// to replay without writing; Complete, Release and Extend compare the
// record's first ten bytes (version, state, token) with what the caller's
// token makes. A Store remembers the fingerprint of each lease it granted
// until it completes or releases it, so that Complete can send the completed
// record whole; when it cannot (another Store granted the lease, or the
// Store forgot it), the function copies the fingerprint from the in-flight
// record.
//
// # Leases
//
// An in-flight record expires (PX) when its lease ends plus its slack, the
// time it is to outlive the lease, which the record holds: the lease has the
// record's PTTL less the slack left. So the Redis server's own clock, through
// the key's expiry, judges every lease, and API instances whose clocks differ
// still agree on who holds one; no function reads the clock. Extend sets the
// expiry to the later of the record's and the new lease's end, and the slack
// to the difference.
//
// # Tokens
//
// The token of a new lease is proposed by the claiming Store: its machine's
// clock in microseconds. When the key has no record, the proposal is the
// token. When the record is released, or its lease expired and the claim
// takes it over, the token is max(the record's token + 1, the proposal): the
// released record is a tombstone that keeps the last token until the record
// would have expired, so tokens grow across Release and takeover whatever any
// clock says. A record disappears only when it expires, at least the TTL
// after the last token for its ID was issued (or when it is deleted or lost,
// below): the proposal is then larger than that token unless the claiming
// machine's clock is behind the one that issued it by more than that time,
// hours with the middleware's default TTL.
//
// # Expiry
//
// A record expires by Redis's own TTL: the claim sets it to the larger of
// the TTL and the lease, Complete to the TTL, Extend pushes it back to cover
// a longer lease, Release keeps it. There is no sweep and no goroutine.
//
// # Retries by the client
//
// go-redis sends a command again after a network error (MaxRetries), though
// the first may have run. Every call carries a random nonce that the function
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
//     token comes from its claiming machine's clock, so it is the larger
//     unless that clock is behind the first claimer's by more than the time
//     between the two claims, and a system that refuses tokens older than the
//     largest it has seen refuses the first holder's late writes.
//   - Eviction and memory. Run the Redis with maxmemory-policy noeviction. An
//     evicting policy (allkeys-* or volatile-*, and every record has a TTL)
//     forgets live records to make room; with noeviction a full Redis refuses
//     the functions, replays included, the middleware answers 503, and
//     nothing runs twice.
//   - Failover on a Cluster. Replication is asynchronous: what a master
//     acknowledged and had not yet sent to its replica is gone once the
//     replica is promoted, so a claim or a completion written just before
//     a failover can be lost, and a retry of that request runs it again
//     (measured in RELIABILITY.md). While the replica is promoted the
//     master's slots answer 503 and nothing runs. After a call that got no
//     answer from a Cluster node, the Store asks the client to reload its
//     slot map, which go-redis otherwise does only once a minute.
//   - A *redis.Ring is a UniversalClient too, but adding or removing one of
//     its shards moves keys, and the records on them seem gone: use a Cluster
//     to shard.
//
// # Monitoring
//
// What the middleware did with each request it tells its observer
// (server.WithObserver). How many records a Redis holds, and how many bytes
// they take, is a few commands, to run when the metrics are collected (from
// an idemotel.StoreSize, for example), not by a poller of its own; and on
// one instance, since the instances share the records. On a Redis, or a
// database number, that holds only the Store's records:
//
//	DBSIZE
//	INFO memory
//
// DBSIZE is the number of records, and used_memory in the reply of INFO
// memory the bytes the server takes for them with its own overhead
// (used_memory_dataset leaves out most of it). On a Redis shared with other
// data, the records are the keys under the Store's prefix (DefaultPrefix
// here):
//
//	SCAN 0 MATCH idempotency:* COUNT 1000
//	MEMORY USAGE <key>
//
// SCAN again from the cursor it returns until it returns 0, counting the
// keys, and add up the MEMORY USAGE of each: that reads every key, so on a
// large keyspace keep the result for a while, or sample. A prefix that holds *, ?, [ or \ must have them escaped with \
// in the pattern. Either way the count includes the released records, which
// stay as tombstones until they expire, and, until Redis reclaims them,
// keys that expired. On a Cluster, run the commands on every master and add
// up.
//
// # Errors
//
// Errors other than server.ErrLeaseLost are store errors: Redis unreachable,
// a function failed or could not be loaded, a record corrupt. They start with
// "redisstore:" and hold no password: the package logs nothing and never
// formats the client's options. How soon an unreachable Redis fails a call is
// the client's configuration (MaxRetries, DialerRetries, DialTimeout; about
// two seconds with go-redis's defaults); with ContextTimeoutEnabled on the
// client, the call's context bounds it, for a Redis that hangs as well as one
// that is down.
//
// # Requirements
//
// Redis 7.0 or later (Functions, and SET with both NX and GET); the tests run
// on 7.0. An older Redis fails every call with a store error. A key or scope
// that holds a Cluster hash tag ("{...}") decides its record's slot, as in any
// Redis key: a client that puts one tag in all its keys puts all its records
// on one node, which costs balance, not correctness.
package redisstore
