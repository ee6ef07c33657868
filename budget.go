package idempotency

import "sync/atomic"

// Costs of the retry budget, in tokens, as in the AWS SDKs' retry quota.
const (
	defaultBudgetCapacity = 500
	retryCost             = 5
	timeoutRetryCost      = 10
	firstTrySuccessRefund = 1
)

// Budget is a retry budget: a bucket of tokens that limits how many retries
// the requests sharing it may make, so that when a server is down the
// clients do not multiply its load by the number of attempts.
//
// A retry costs 5 tokens, or 10 when the failed attempt timed out (a timeout
// is the likeliest sign of an overloaded server). A retry that would take
// more tokens than are left is not made: Do returns the last result, and the
// outcome says ErrBudgetExhausted. A request that succeeds on its first
// attempt puts back 1 token; one that succeeds after retries puts back what
// its retries took. The bucket never holds more than its capacity. Here
// "succeeds" means that an attempt got a response that the retry policy does
// not retry.
//
// With the default capacity of 500 a client can make 100 retries in a row
// before it must see successes again; in steady operation, where nearly
// every first attempt succeeds, the budget stays full.
//
// Every Client has its own Budget of capacity 500 unless WithBudget shares
// one between clients or turns it off. The tokens left are in every Event
// (Event.Budget). A Budget is safe for
// concurrent use. The zero Budget has capacity 0 and so permits no retries;
// use NewBudget.
type Budget struct {
	capacity int64
	tokens   atomic.Int64
}

// NewBudget returns a full Budget that holds at most capacity tokens.
// A capacity below 0 is taken as 0, which permits no retries.
func NewBudget(capacity int) *Budget {
	b := &Budget{capacity: int64(max(capacity, 0))}
	b.tokens.Store(b.capacity)
	return b
}

// left returns the number of tokens left, or -1 for a nil Budget, which
// permits every retry.
func (b *Budget) left() int {
	if b == nil {
		return -1
	}
	return int(b.tokens.Load())
}

// take removes cost tokens if there are that many. A nil Budget permits
// every retry.
func (b *Budget) take(cost int64) bool {
	if b == nil {
		return true
	}
	for {
		t := b.tokens.Load()
		if t < cost {
			return false
		}
		if b.tokens.CompareAndSwap(t, t-cost) {
			return true
		}
	}
}

// refund puts back n tokens, up to the capacity.
func (b *Budget) refund(n int64) {
	if b == nil || n <= 0 {
		return
	}
	for {
		t := b.tokens.Load()
		if t >= b.capacity {
			return
		}
		// Not t+n, which can overflow near the largest capacity.
		if b.tokens.CompareAndSwap(t, t+min(n, b.capacity-t)) {
			return
		}
	}
}

// succeeded records a request that ended with a response after attempts
// attempts whose retries took spent tokens.
func (b *Budget) succeeded(attempts int, spent int64) {
	if attempts == 1 {
		b.refund(firstTrySuccessRefund)
		return
	}
	b.refund(spent)
}
