package sqlrecord

import (
	"context"
	"database/sql"
	"errors"
	"sync"

	"github.com/idemkit/idempotency/engine"
)

// ErrClosed is what a transaction ended by Close reports.
var ErrClosed = errors.New("store closed")

// Txs are the open transactions of transactional mode, one per lease, from
// the Claim that began it to the Complete, Release or Close that ends it.
// The zero value is ready to use.
type Txs struct {
	mu     sync.Mutex
	open   map[txKey]*OpenTx
	closed bool
}

type txKey struct {
	id    engine.ID
	token engine.Token
}

// OpenTx is one transaction, and what its end must undo.
type OpenTx struct {
	Tx *sql.Tx
	// End, if set, runs after the transaction ended (it gives a
	// connection back, say).
	End func()
	// Steps serializes the steps saved in the transaction, so that two
	// saved at once do not interleave their statements on its connection.
	Steps sync.Mutex
	// cancels cancel the contexts that Bind returned for it.
	cancels []context.CancelCauseFunc
}

// Put keeps o for the lease; it reports false, keeping nothing, after
// CloseAll.
func (t *Txs) Put(id engine.ID, token engine.Token, o *OpenTx) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	if t.open == nil {
		t.open = make(map[txKey]*OpenTx)
	}
	t.open[txKey{id, token}] = o
	return true
}

// Bind returns ctx carrying the lease's transaction under key, and a
// context that Take's caller cancels once the transaction ends; ok is false
// when the lease has no open transaction.
func (t *Txs) Bind(ctx context.Context, id engine.ID, token engine.Token, key any) (context.Context, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	o := t.open[txKey{id, token}]
	if o == nil {
		return ctx, false
	}
	ctx, cancel := context.WithCancelCause(context.WithValue(ctx, key, o.Tx))
	o.cancels = append(o.cancels, cancel)
	return ctx, true
}

// Has reports whether the lease's transaction is open.
func (t *Txs) Has(id engine.ID, token engine.Token) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.open[txKey{id, token}] != nil
}

// Get returns the lease's transaction, which stays open; nil when there is
// none.
func (t *Txs) Get(id engine.ID, token engine.Token) *OpenTx {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.open[txKey{id, token}]
}

// Take removes the lease's transaction, which its caller then ends; nil
// when there is none.
func (t *Txs) Take(id engine.ID, token engine.Token) *OpenTx {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := txKey{id, token}
	o := t.open[k]
	delete(t.open, k)
	return o
}

// Done cancels the contexts bound to o, with cause, and runs o.End.
func (o *OpenTx) Done(cause error) {
	for _, c := range o.cancels {
		c(cause)
	}
	if o.End != nil {
		o.End()
	}
}

// CloseAll refuses every Put from now on and rolls back every open
// transaction.
func (t *Txs) CloseAll() {
	t.mu.Lock()
	t.closed = true
	open := t.open
	t.open = nil
	t.mu.Unlock()
	for _, o := range open {
		o.Tx.Rollback()
		o.Done(ErrClosed)
	}
}
