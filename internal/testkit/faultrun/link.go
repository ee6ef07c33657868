package faultrun

import (
	"errors"
	"time"

	"github.com/idemkit/idempotency/internal/testkit/faultnet"
	"github.com/idemkit/idempotency/internal/testkit/faultstore"
)

// StoreLink is the way from the middleware to its store, which a run cuts
// or slows during a Window and heals after it.
type StoreLink interface {
	// Cut makes every store operation fail at once.
	Cut()
	// Slow makes every store operation take latency longer.
	Slow(latency time.Duration)
	// Heal ends Cut and Slow.
	Heal()
}

var _ StoreLink = (*faultnet.TCPProxy)(nil)

// errCut is the error of every operation of a store that FaultStoreLink cut.
var errCut = errors.New("faultrun: the link to the store is cut")

// FaultStoreLink is the StoreLink of a store that lives in the process, such
// as memstore, through a faultstore wrapped around it: Cut fails every
// operation, and Slow delays each one before it is passed on, so that an
// operation slower than the middleware's store timeout is abandoned before
// it reaches the store (unlike a network, which may still deliver it late).
func FaultStoreLink(s *faultstore.Store) StoreLink { return faultStoreLink{s} }

type faultStoreLink struct{ s *faultstore.Store }

var allOps = []faultstore.Op{faultstore.Claim, faultstore.Complete, faultstore.Release, faultstore.Extend}

func (l faultStoreLink) Cut() {
	for _, op := range allOps {
		l.s.Set(op, faultstore.Fault{Err: errCut})
	}
}

func (l faultStoreLink) Slow(latency time.Duration) {
	for _, op := range allOps {
		l.s.Set(op, faultstore.Fault{Delay: latency})
	}
}

func (l faultStoreLink) Heal() {
	for _, op := range allOps {
		l.s.Clear(op)
	}
}
