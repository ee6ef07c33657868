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
// On the server, with any engine.Store (store/memstore, store/pgstore,
// store/redisstore), after the application's own interceptors (its
// authentication, whose principal names the scope):
//
//	s, err := idemgrpc.NewServer(store, idemgrpc.WithScope(principal))
//	srv := grpc.NewServer(append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(auth)}, s.ServerOptions()...)...)
//	...
//	srv.GracefulStop()
//	s.Shutdown(ctx)
//
// The server interceptor is the gRPC door of package engine, which runs the
// protocol (claim, wait or refuse in flight, run under a renewed lease with
// fencing, store or release). A call is identified by its key, in a scope,
// and fingerprinted by the SHA-256 of its full method and of its request's
// bytes as the client sent them: the same key with another request is
// refused. The bytes, not the request decoded and encoded again, so that two
// releases whose schemas differ (a rolling deploy that adds a field) agree
// on a retry's fingerprint; ServerOptions installs the codec and stats
// handler through which the interceptor sees them (the interceptor alone
// fingerprints the request encoded again, and says so once in the log). A
// client must send the same bytes on every attempt of a call: gRPC's own
// retries do, and so does the client interceptor, which marshals
// deterministically (proto.Marshal writes a map's entries in a random
// order); a Go client that retries by itself must marshal deterministically
// too. The bytes are kept whole, so no two requests share a fingerprint
// (proto3 strings that are not UTF-8 are refused by protobuf itself).
//
// # The scope
//
// By default the scope is a hash of the authorization metadata
// ("cred:" and 32 hex digits), so that two callers' keys never meet. A bearer token
// (OAuth, JWT) is refreshed as it nears its expiry, so the retry of a call
// whose answer was lost may carry another token than the call: under the
// default scope it is another caller's, and runs again. Set WithScope to
// the principal the application authenticated (an interceptor placed
// before the Server's puts it in the context); the first call scoped by a
// bearer token is logged at warn level.
//
// # Streams
//
// Only unary calls are protected: a streaming call's answer is not one
// message to store and replay. A streaming call that carries a key, on a
// protected method, is refused (Unimplemented, STREAMING_UNSUPPORTED) by
// the stream interceptor of ServerOptions and does not run, so that no
// client believes it protected; a streaming method left out of WithMethods
// is not protected, and its keyed calls run. Streaming calls without a key
// go through.
//
// The handler's answer is stored as it was given: a response message
// (proto.Marshal) with the header and trailer metadata it set, or an error
// (its google.rpc.Status, with code, message and details; a message that
// is not UTF-8, which protobuf refuses to marshal, is kept as it is, and
// gRPC delivers it alike the first time and on a replay), unless its code
// means "retry": Unavailable, Internal, Unknown, ResourceExhausted,
// Aborted, DeadlineExceeded and Canceled release the key, so that the retry
// runs the handler again (WithKeep changes which codes are kept). A replay
// carries the header idempotent-replayed: true (see Replayed and
// WithReport); the answers Aborted and Unavailable carry the retry-after
// trailer, in whole seconds, beside their RetryInfo detail. The response type of a replay is found in
// protoregistry.GlobalFiles, where generated code registers every service;
// WithResponseType names it for the others.
//
// # Codes
//
// The answers the server interceptor makes itself carry a
// google.rpc.ErrorInfo detail with the domain
// "idempotency.idemkit.github.com" and a Reason (read it with [Reason]):
//
//	condition                          code                reason                retry
//	---------------------------------  ------------------  --------------------  ------------------------------
//	key missing (keys required)        InvalidArgument     KEY_MISSING           no
//	key malformed (empty, > 255 bytes, InvalidArgument     KEY_INVALID           no
//	  not printable ASCII, two values,
//	  refused by WithKeyFormat)
//	request unidentified (not a        InvalidArgument     REQUEST_UNIDENTIFIED  no
//	  message, scope function failed
//	  or too long)
//	streaming call with a key          Unimplemented       STREAMING_UNSUPPORTED no
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
// Every call of a protected method is told to the observer (WithConfig),
// those refused before any claim included: EventRejected, with the code as
// its Status; a call run without protection (WithKeyOptional without a
// key, or the store failing under Config.FailOpen) is EventUnprotected.
//
// A handler's panic releases the key and goes on, to a recovery
// interceptor placed outside this one, or to gRPC. When the store is slow
// to take an answer, the engine answers first and stores it afterwards,
// in the background (Shutdown waits for those); a unary gRPC answer leaves
// only when the interceptor returns, so in the rare case where the engine
// cannot store in the background (too many answers already waiting, or
// after Shutdown) the answer waits for the store, at most one lease.
//
// The client interceptor retries Unavailable, DeadlineExceeded and Aborted,
// with exponential backoff and full jitter (WithBackoff), up to
// WithMaxAttempts attempts, waiting as long as a RetryInfo detail asks (up
// to WithMaxRetryAfter). Every attempt of a call carries the same key;
// gRPC's own retries (a service config retryPolicy, which can retry other
// codes) run below the interceptor and carry it too, as does an
// interceptor chained after it, which runs once per attempt (to bound each
// attempt with a timeout of its own, say). A key the caller put in the
// outgoing metadata, or with idempotency.ContextWithKey, is kept; an
// interceptor chained before it can put one there. To watch every call's
// Report, an interceptor chained before it can add WithReport to the
// call's options.
package idemgrpc
