// Package idemgrpc makes retried unary gRPC calls safe with idempotency
// keys, as the library's HTTP client and middleware do for HTTP: the
// client interceptor gives each call a key, sends it in the
// idempotency-key metadata with every attempt and retries; the server
// interceptor runs a call's handler at most once per key while its record
// lives in the store, and answers every later attempt with the answer the
// first one stored.
//
// On the client:
//
//	ci, err := idemgrpc.UnaryClientInterceptor()
//	conn, err := grpc.NewClient(target, grpc.WithChainUnaryInterceptor(ci), ...)
//
// On the server, with any engine.Store (server/memstore, server/pgstore,
// server/redisstore):
//
//	s, err := idemgrpc.NewServer(store)
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(s.UnaryServerInterceptor()))
//	...
//	srv.GracefulStop()
//	s.Shutdown(ctx)
//
// The server interceptor is the gRPC door of package engine, which runs the
// protocol (claim, wait or refuse in flight, run under a renewed lease with
// fencing, store or release). A call is identified by its key, in a scope
// (by default a hash of the authorization metadata), and fingerprinted by
// the SHA-256 of its full method and its request message marshalled
// deterministically: the same key with another request is refused. The
// handler's answer is stored as it was given: a response message
// (proto.Marshal) with the header and trailer metadata it set, or an error
// (its google.rpc.Status, with code, message and details), unless its code
// means "retry": Unavailable, Internal, Unknown, ResourceExhausted,
// Aborted, DeadlineExceeded and Canceled release the key, so that the retry
// runs the handler again (WithReleaseCodes changes the list). A replay
// carries the header idempotent-replayed: true (see Replayed and
// WithReport). The response type of a replay is found in
// protoregistry.GlobalFiles, where generated code registers every service;
// WithResponseType names it for the others.
//
// # Codes
//
// The answers the server interceptor makes itself carry a
// google.rpc.ErrorInfo detail with ErrorDomain and a Reason (read it with
// [Reason]):
//
//	condition                          code                reason                retry
//	---------------------------------  ------------------  --------------------  ------------------------------
//	key missing (keys required)        InvalidArgument     KEY_MISSING           no
//	key malformed (empty, > 255 bytes, InvalidArgument     KEY_INVALID           no
//	  not printable ASCII, two values,
//	  refused by WithKeyFormat)
//	request unidentified (not a        InvalidArgument     REQUEST_UNIDENTIFIED  no
//	  message, scope function failed)
//	in flight (another attempt runs)   Aborted             IN_FLIGHT             yes, after RetryInfo /
//	                                                                              retry-after trailer
//	key reused for another request     FailedPrecondition  KEY_MISMATCH          no
//	store unavailable (nothing ran)    Unavailable         STORE_UNAVAILABLE     yes, after RetryInfo /
//	                                                                              retry-after trailer
//	outcome unknown (RefuseAbandoned:  DataLoss            OUTCOME_UNKNOWN       never: stored and replayed
//	  an earlier holder was lost)
//	answer ran, too large to store     DataLoss            RESPONSE_OMITTED      never
//
// Key mismatch is FailedPrecondition, not InvalidArgument: the request is
// valid in itself, and is refused because of the state of the system (the
// key is bound to another request), which is what FailedPrecondition means;
// no retry changes it. Outcome unknown is DataLoss: the first attempt's
// answer is lost for good and whether it took effect cannot be told, which
// someone must check; unlike Aborted (which the interceptor and most retry
// policies retry) no client retries DataLoss, and it stands out in
// monitoring.
//
// A handler's panic releases the key and goes on, to a recovery
// interceptor placed outside this one, or to gRPC. When the store is slow
// to take an answer, the engine answers first and stores it afterwards,
// in the background (Shutdown waits for those); a unary gRPC answer leaves
// only when the interceptor returns, so in the rare case where the engine
// cannot store in the background (too many answers already waiting, or
// after Shutdown) the answer waits for the store, at most one lease.
//
// The client interceptor retries Unavailable, DeadlineExceeded and Aborted
// by default (WithRetryCodes), with exponential backoff and full jitter
// (WithBackoff), up to WithMaxAttempts attempts, each bounded by
// WithAttemptTimeout, waiting as long as a RetryInfo detail asks (up to
// WithMaxRetryInfo). Every attempt of a call carries the same key; gRPC's
// own retries (a service config retryPolicy) run below the interceptor and
// carry it too. A key the caller put in the outgoing metadata, or with
// idempotency.ContextWithKey, is kept.
package idemgrpc
