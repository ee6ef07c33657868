package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idempotency/engine"
)

// A transaction of transactional mode can end without the Store: the server
// ends the session of one left idle longer than the idle timeout
// (WithIdleTimeout), an operator may terminate its backend, its connection
// may break. Its row lock goes with it, so the next Claim of the key
// acquires the key and runs the request again, while the handler that held
// it may still be running: waiting on another service, say, before an
// effect outside the database. That handler must be told. Nothing may read
// the transaction's connection meanwhile (the handler may be using it), so
// the Store asks the server, on another connection of the pool, whether
// each open transaction's backend is still in it: Extend does for its
// lease, and a watcher does for every open transaction, every watchInterval,
// while any is open. A transaction found ended makes Extend fail with
// engine.ErrLeaseLost and cancels the contexts that Bind returned for it.

// errTxEnded is the cause with which the contexts that Bind returned are
// cancelled when the server ended their transaction.
var errTxEnded = fmt.Errorf("pgstore: %w", errEndedByServer)

// errTxClosed is the cause with which Close cancels the contexts that Bind
// returned for the transactions it rolls back.
var errTxClosed = fmt.Errorf("pgstore: transaction rolled back by Close: %w", engine.ErrLeaseLost)

// errEndedByServer is what Extend's error wraps when the server ended the
// lease's transaction.
var errEndedByServer = fmt.Errorf("transaction ended by the server: %w", engine.ErrLeaseLost)

// backend identifies a transaction on the server: the backend process that
// runs it and when it began, pg_stat_activity's pid and xact_start. The
// process ID alone could, in time, be a new backend's. Both come from the
// server, from within the transaction: behind a pooler, the process ID that
// the connection reports is the pooler's.
type backend struct {
	pid   int32
	start time.Time
}

// aliveSQL returns the ordinal (from 1) of each backend, of the process
// IDs $1 and transaction starts $2, that is still in its transaction. A
// backend whose state the Store's role may not see (another role's, without
// pg_read_all_stats) counts as alive.
const aliveSQL = `SELECT p.i FROM unnest($1::int4[], $2::timestamptz[]) WITH ORDINALITY AS p(pid, start, i)
WHERE EXISTS (SELECT 1 FROM pg_stat_activity a
	WHERE a.pid = p.pid AND (a.xact_start = p.start OR a.state IS NULL))`

// watchTimeout bounds one look of the watcher, waiting for a connection
// included.
const watchTimeout = 5 * time.Second

// watchInterval is how often the watcher looks: a quarter of the idle
// timeout, the likeliest end of a transaction that the Store did not end
// itself, between 25 ms and a second.
func watchInterval(idle time.Duration) time.Duration {
	if idle <= 0 {
		return time.Second
	}
	return min(max(idle/4, 25*time.Millisecond), time.Second)
}

// alive reports, for each of bs, whether its transaction is still open on
// the server.
func (s *store) alive(ctx context.Context, bs []backend) ([]bool, error) {
	pids := make([]int32, len(bs))
	starts := make([]time.Time, len(bs))
	for i, b := range bs {
		pids[i], starts[i] = b.pid, b.start
	}
	var live []bool
	err := s.retry(ctx, func() error {
		rows, err := s.pool.Query(ctx, aliveSQL, s.hotMode(), pids, starts)
		if err != nil {
			return err
		}
		ords, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		live = make([]bool, len(bs))
		for _, i := range ords {
			if i >= 1 && int(i) <= len(bs) {
				live[i-1] = true
			}
		}
		return nil
	})
	return live, err
}

// ended records that the server ended o's transaction, and cancels the
// contexts bound to it. Complete and Release still end it as before.
func (s *store) ended(k txKey, o *openTx) {
	s.mu.Lock()
	if s.txs[k] != o || o.ended {
		s.mu.Unlock()
		return
	}
	o.ended = true
	cancels := o.cancels
	o.cancels = nil
	s.mu.Unlock()
	for _, cancel := range cancels {
		cancel(errTxEnded)
	}
}

// watch looks, every s.watchEvery, whether the open transactions are still
// open on the server, until none is (or Close). It is started by the Claim
// that opens a transaction when no watcher runs; Close stops it and waits
// for it.
func (s *store) watch() {
	defer s.watchers.Done()
	timer := time.NewTimer(s.watchEvery)
	defer timer.Stop()
	failing := false
	for {
		select {
		case <-s.watchCtx.Done():
			return
		case <-timer.C:
		}
		keys, txs, bs := s.watched()
		if keys == nil {
			return
		}
		ctx, cancel := context.WithTimeout(s.watchCtx, watchTimeout)
		live, err := s.alive(ctx, bs)
		cancel()
		switch {
		case err != nil && s.watchCtx.Err() != nil:
			return
		case err != nil:
			if !failing {
				s.log.Warn("pgstore: cannot tell whether the open transactions are still open; trying again", "err", err)
			}
			failing = true
		default:
			failing = false
			for i, ok := range live {
				if !ok {
					s.ended(keys[i], txs[i])
				}
			}
		}
		timer.Reset(s.watchEvery)
	}
}

// watched returns the open transactions that the server has not been found
// to have ended, or nil, when there are none, after which the watcher stops
// and the next Claim that opens a transaction starts another.
func (s *store) watched() ([]txKey, []*openTx, []backend) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var (
		keys []txKey
		txs  []*openTx
		bs   []backend
	)
	for k, o := range s.txs {
		if !o.ended {
			keys, txs, bs = append(keys, k), append(txs, o), append(bs, o.backend)
		}
	}
	if keys == nil {
		s.watching = false
	}
	return keys, txs, bs
}
