// Package redisstore is an engine.Store (engine.Store) kept in Redis, through go-redis v9:
// for an API that runs as several processes, on a standalone Redis, behind
// Sentinel, or on a Redis Cluster.
//
// # Data layout
//
// A record is one Redis string under one key: the prefix ("idempotency:"
// unless WithPrefix says otherwise), the scope's length in decimal, ":", the
// scope, ":", the key. The length makes the encoding injective, whatever bytes
// scope and key hold. Store.RecordKey returns it. The steps of a call in
// flight that records steps are in a second key beside it (see Steps).
//
// The value is binary and versioned. Version 3, which this release writes, is
// a header of 42 bytes (the version, the state: in flight, completed,
// released, or in flight with steps (see Steps), the fencing token, the nonce of the call that last changed the
// state, the lease's slack, the fingerprint's length, how many holders
// abandoned the record before, and when it was first claimed, by the clock
// of the machine whose Store claimed it), the fingerprint, and, once completed, the response:
// status, a body-omitted flag, headers in increasing order of name with the
// order of their values kept, and the body, byte for byte. A record with an
// unknown version, or one that is truncated or malformed, is never replayed:
// Claim fails on it with ErrCorruptRecord, a store error, as does every
// other operation that reads the damaged part.
//
// Records of versions 1 and 2, which earlier releases wrote, are read: a
// completed one is replayed; an in-flight one is in flight until its lease
// ends (version 1 holds the end as a time, judged by the Redis server's
// clock, TIME; version 2 by its expiry, as version 3) and is then taken over
// into version 3; a released one passes its token on. Complete, Release and
// Extend answer engine.ErrLeaseLost on them, since only an earlier release
// can hold their leases. Earlier releases do not read version 3: while both
// run against one Redis, as in a rolling upgrade, an instance of the earlier
// release answers 503 (a store error) for a key that this release wrote,
// until every instance runs this one.
//
// # Takeovers and operators
//
// A claim that takes over a lease that ran out (its holder died, hung or
// lost Redis) reports it in Claim.Abandoned: 1 for the first takeover, 2 for
// the next. The count lives in the record, so it is seen only while the
// record lives: an in-flight record outlives its lease by the TTL, whatever
// the two are and however often the lease was extended, so a retry within
// the TTL after the lost holder's lease is told of it. A release by a holder
// that took the record over keeps the count: the record goes back to how
// the takeover found it (in flight, its lease over), so the next claim is
// told of the same lost holders; only a release by the holder that created
// the record makes the key new again, unless the record holds steps (see
// Steps).
//
// Store.Lookup and Store.Resolve (engine.Inspector) let an operator read a
// record (state, fingerprint, token, abandoned holders, first claim, lease
// end, expiry, response, steps) and settle it: Resolve with a response records the
// request as done; with nil it releases the record, so that the next request
// runs. Either way the holder's token is refused from then on.
//
// # Functions
//
// Complete, Release, Extend and SaveStep are each one Redis Function, called
// with FCALL: one round trip. Claim is one plain command, SET NX PX GET, when the
// key has no record or a completed one (a first execution, a replay), and
// its function, in a second round trip, when the record is in flight or
// released. The functions are in one library whose name holds a
// digest of its code ("idempotency_" and 12 hex digits), so that Stores of
// different releases sharing a Redis each call their own: a change to the
// code is a library of another name, loaded beside the earlier one, and no
// Store ever calls a function of another release's library. A function
// reads and writes the record's key and, for a record that holds steps, its
// steps key, which is in the same slot (see Steps), so it is atomic, and on
// a Cluster it runs on the node that owns the record: no operation ever
// spans two slots. The fencing token is checked inside the function.
//
// New does no I/O. A call that finds a server without the library (a new
// server, one restarted without persistence, one whose functions were
// flushed, a replica promoted without them, the target of a slot that
// migrates) loads it with FUNCTION LOAD REPLACE and calls again: a function
// that was not found has not run. On a Cluster it loads it on every master,
// since the node that answered may be one the client was redirected to (ASK,
// MOVED), not the owner in its slot map; and, when no slot map lists the
// node that serves the key (a master added with CLUSTER MEET that owns no
// slot yet, to which a slot migrates), which the key's master names when
// asked the key's PTTL, on that node too, through a client of its own. That
// call takes three round trips or more; the next ones on that server take
// one. A library of an earlier release stays on the server until removed
// with FUNCTION DELETE.
//
// # ACL
//
// The functions run their commands as the user the client logs in as, so
// that user needs them too, not only FCALL and FUNCTION LOAD. The exact ACL,
// for the default prefix (use the Store's own prefix in the key pattern),
// tested by TestDocumentedACL:
//
//	ACL SETUSER idempotency on >password resetkeys ~idempotency:* resetchannels -@all
//	    +fcall +function|load +get +set +pttl +pexpire +setrange +time
//	    +del +hset +hdel +hlen +hexists +hgetall +pexpireat +pexpiretime
//	    +wait +config|get +info
//
// +del, the hash commands, +pexpireat and +pexpiretime are for steps (see
// Steps): a call that records no step runs none of them. +wait is for
// WithReplicaAck, +config|get and +info for Check (CONFIG GET,
// or INFO memory where CONFIG is refused) and for reading proto-max-bulk-len
// (see [Store.Complete]). A command the ACL refuses fails the call with Redis's
// NOPERM (or, from inside a function on Redis 7.0, "The user executing the
// script can't run this command"), reported as a permission error that
// points here, never as a corrupt record.
//
// The common paths are a command or two and a comparison of bytes prepared
// by the Store: a claim of a new key is SET NX PX GET of an in-flight record
// built by the Store, sent by the Store itself, and the same command returns
// a completed record to replay without writing; Complete, Release and Extend compare the
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
// still agree on who holds one; no function reads the clock. The claim
// sets the slack to the TTL; Extend sets the expiry to the later of the
// record's and the new lease's end plus the slack, and the slack to the
// difference, so that it never shrinks.
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
// A record expires by Redis's own TTL: the claim sets it to the lease plus
// the TTL, Complete to the TTL, Extend pushes it back with the lease's end,
// Release keeps it. Its steps key expires with it, to the millisecond (see
// Steps). There is no sweep and no goroutine.
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
//     WithReplicaAck makes a claim wait for a replica (see Replication).
//   - Eviction and memory. Run the Redis with maxmemory-policy noeviction. An
//     evicting policy (allkeys-* or volatile-*, and every record has a TTL)
//     forgets live records to make room: a completed request runs again, an
//     in-flight one can run twice at once. With noeviction a full Redis
//     refuses the functions (OOM), replays included, the middleware answers
//     503, and nothing runs twice. Store.Check finds a Redis that may evict
//     (a maxmemory and a policy other than noeviction) and fails with
//     ErrEviction; Open runs it at start and logs an error (slog.Default
//     unless WithLogger), or, WithStrictEviction, refuses to start. Where
//     CONFIG GET is refused (managed services rename or forbid it) Check
//     reads INFO memory; a Redis that answers neither is reported as unknown.
//     The policy can be changed while the Store runs: run Check from the
//     health check too.
//   - Failover on a Cluster. Replication is asynchronous: what a master
//     acknowledged and had not yet sent to its replica is gone once the
//     replica is promoted, so a claim or a completion written just before
//     a failover can be lost, and a retry of that request runs it again
//     (measured in RELIABILITY.md). While the replica is promoted the
//     master's slots answer 503 and nothing runs; a master that hangs
//     rather than refuses costs a call no more than its deadline, with or
//     without ContextTimeoutEnabled. After a call that got no
//     answer from a Cluster node, the Store asks the client to reload its
//     slot map, which go-redis otherwise does only once a minute.
//     WithReplicaAck closes the gap for claims (see Replication).
//   - A *redis.Ring is a UniversalClient too, but adding or removing one of
//     its shards moves keys, and the records on them seem gone: use a Cluster
//     to shard.
//
// # Monitoring
//
// What the middleware did with each request it tells its observer (the
// Observer of engine.Config, given to a door with WithConfig). How many
// records a Redis holds, and how many bytes they take, is a few commands,
// to run when the metrics are collected (from the function given to
// idemotel.RegisterStoreSize, for example), not by a poller of its own; and
// on one instance, since the instances share the records. On a Redis, or a
// database number, that holds only the Store's records:
//
//	DBSIZE
//	INFO memory
//
// DBSIZE is the number of records (and of steps keys, one for each call in
// flight that recorded a step), and used_memory in the reply of INFO
// memory the bytes the server takes for them with its own overhead
// (used_memory_dataset leaves out most of it). On a Redis shared with other
// data, the records are the keys under the Store's prefix ("idempotency:"
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
// # Steps
//
// A Store is an engine.StepStore: it keeps the steps of a call (package
// step) beside its record, in a hash under a key of their own, the steps
// key, one field per step, named by the step's name, whose value is a byte
// of flags (done), the fingerprint's length (a uvarint), the fingerprint
// and the result, byte for byte. The steps key is the prefix, then "{s",
// two bytes and "}" (when the prefix holds braces, what else keeps the key
// in the record's slot), then the rest of the record key: under the prefix,
// which the ACL's key pattern names; never a record key; and in the
// record's Cluster slot whatever hash tag the prefix, the scope or the key
// hold (the two bytes make the CRC-16 of the hashed part land on the
// record's slot), so that a function that runs on the record's node reaches
// it.
//
// A record that holds steps is in a fourth state, in flight with steps,
// and the functions touch the steps key only then, or when SaveStep records
// a record's first step. So a first execution and a replay run the commands
// they ran before, and neither they nor the Extend or the Release of a call
// that records no step send a command to a steps key (measured by the
// server's own count, TestFirstExecutionLeavesStepsAlone).
//
// A step costs one round trip: SaveStep is one function call, which checks
// the lease (the token, and the record in flight), writes the step (HSET;
// HDEL for a step without a fingerprint, which removes its name's) and
// gives the steps key the record's expiry (PEXPIREAT to the record's
// PEXPIRETIME); WithReplicaAck sends WAIT with it, as with Complete. It
// refuses more than 100 steps and more than 64 KiB (65,536
// bytes a step with an error wrapping engine.ErrNotStorable. A claim that
// takes over or re-acquires a record with steps gets them from the claim
// function that it calls anyway (HGETALL), in the same round trip, and
// gives them the record's new expiry; Extend moves their expiry with the
// record's; Release keeps a record that holds steps, even the one its
// holder created, in flight with its lease over as after the release of a
// takeover (the next claim with the same fingerprint takes it over at once,
// with the steps; another fingerprint is refused until it expires), and
// keeps their expiry; Complete and Resolve delete them; Lookup returns
// them. So a steps key expires when its record does, to the millisecond.
//
// The steps key is named in an argument, not declared as a key of the call:
// while a slot migrates, Redis refuses (TRYAGAIN) a call that declares two
// keys of which one only is on the node, which every record without steps
// would be. What remains: while a slot migrates, a record's first step on
// the node that the slot leaves is refused (Redis creates no key there:
// "Script attempted to access a non local key"), as is a call on a record
// that the migration has moved apart from its steps key; the engine tries
// the step again within its store timeout, and the call fails if the
// migration outlasts it. A record deleted by hand (DEL of its RecordKey)
// leaves its steps key until that key expires; the next record of the key
// does not see those steps, and its first step deletes them.
//
// Earlier releases do not read the fourth state: while both run against one
// Redis, an instance of an earlier release answers 503 (a store error) for
// a key whose record holds steps, as for any record it cannot read; its
// functions change nothing there, neither taking the lease nor dropping the
// steps (TestEarlierLibraryRefusesSteps).
//
// # Replication
//
// WithReplicaAck(n, timeout) makes Claim, Complete and SaveStep send WAIT n
// timeout on the connection of their function, in the same round trip. A claim that
// fewer than n replicas acknowledged is released and fails with
// ErrNotReplicated: the middleware answers 503 and the handler does not run,
// so a failover to an acknowledging replica never loses a claim that a
// handler ran for. The release keeps what the record knew: a takeover of a
// lost holder released this way leaves the record as it found it, and the
// next claim is told of that holder. WAIT waits for timeout, or half of
// what the call has left before its context's deadline if that is less, so
// that a claim is answered or released before the middleware's claim
// timeout (its store timeout, and at most nine tenths of the lease) ends:
// one left unanswered would stay in flight until its lease ended, and the
// retry would be told of an abandoned holder that never ran. A completion
// that fewer acknowledged fails with
// ErrNotReplicated; the middleware applies its policy for a failed Complete
// (the response may be on the master only). So does a step, which the
// engine tries again within its store timeout (the step is on the master).
// The cost is a replica's round trip on every claim, completion and step,
// and 503s while no replica is in sync,
// after a failover too, until the promoted master has a replica: give each
// master one more replica than n. Measured (RELIABILITY.md): a Cluster
// failover with 100 ms of replication lag ran 71 of 10,024 orders twice
// without it and none of 10,025 with it; a Sentinel switchover (SENTINEL
// FAILOVER) ran 1,691 of 22,148 twice without it and none of 6,522 with it.
//
// min-replicas-to-write (with min-replicas-max-lag) is the server's
// companion: a master that has fewer replicas in sync refuses every write, so
// an old master cut off from its replicas stops accepting claims within
// min-replicas-max-lag seconds. Neither promises more than this. WAIT
// counts replicas that received the write, not ones that wrote it to disk;
// a replica that acknowledged may itself be lost; Sentinel and Cluster may
// still promote a replica that had not acknowledged (one whose n peers were
// all lost); and a write that failed WAIT stays on the master, where it is
// seen until a failover loses it. WAIT does not make Redis consistent; it
// makes the loss of an acknowledged claim need more failures at once.
//
// # Errors
//
// Errors other than engine.ErrLeaseLost are store errors: Redis unreachable,
// a function failed or could not be loaded, a permission refused, a record
// corrupt. They start with "redisstore:" and hold no password: the package
// logs nothing but what Open found and never formats the client's options.
//
// Complete fails with an error wrapping engine.ErrNotStorable when Redis
// will never take the record, so that the middleware records the request as
// done without its body: a record above 512 MiB (Redis's largest string),
// one above the server's proto-max-bulk-len (Redis answers "Protocol error:
// invalid bulk length" and closes the connection, or resets it while the
// record is still being sent; the Store then reads the limit, CONFIG GET
// proto-max-bulk-len, and compares), or "string exceeds maximum allowed
// size". A full Redis (OOM), a timeout or a network error is not one: another
// try may pass.
//
// Every call ends by its context's deadline (the middleware's store
// timeout), whatever the client: with ContextTimeoutEnabled go-redis bounds
// its I/O by the deadline. A *redis.Client without it is used through a
// clone of it (Client.WithTimeout) that shares its connection pool and has
// it, so that its I/O ends at the earlier of the deadline and the client's
// own timeouts, on the caller's goroutine; the clone runs none of the
// client's hooks (go-redis does not copy them), so give an instrumented
// client ContextTimeoutEnabled. A Cluster or Ring client without it, which
// would wait for its own ReadTimeout (5 s by default) and does not even see
// the call's context, is used the same way, node by node: the Store asks the
// client which master (or shard) owns the record's key, and calls it
// through a clone of that node's client that has ContextTimeoutEnabled,
// made the first time a call goes to the node. Until a call through a
// Cluster client has been answered, the client may not have read the slot
// map, which it would read on the caller's goroutine by its own timeouts:
// those calls go through the Cluster client itself, on a goroutine of
// their own. A node that answers MOVED
// or ASK (its slot is migrating, or has moved) has not run the call, which
// then goes through the Cluster client itself, which follows the
// redirection, on a goroutine of its own so that it still returns at the
// deadline: only then does a call cost a goroutine (one per call cost
// 12–17% of a request's CPU in the load runs). How soon before the deadline a Redis
// that is down fails a call is the client's configuration: go-redis's
// defaults retry the dial (DialerRetries, 5) and the command (MaxRetries, 3)
// with backoff, about two seconds for a refused connection. For a store that
// fails fast, and a middleware that answers 503 at once:
//
//	DialTimeout:   time.Second, // a SYN that goes unanswered
//	DialerRetries: 1,
//	MaxRetries:    -1,          // the middleware's client retries, with the key
//	ReadTimeout:   time.Second, // without ContextTimeoutEnabled
//	WriteTimeout:  time.Second,
//	ContextTimeoutEnabled: true,
//
// # Requirements
//
// Redis 7.0 or later (Functions, and SET with both NX and GET); the tests run
// on 7.0. An older Redis fails every call with a store error that says so. A key or scope
// that holds a Cluster hash tag ("{...}") decides its record's slot, as in any
// Redis key: a client that puts one tag in all its keys puts all its records
// on one node, which costs balance, not correctness.
package redisstore
