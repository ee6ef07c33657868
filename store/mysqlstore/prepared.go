package mysqlstore

import (
	"context"
	"database/sql"
	"sync"
)

// prepared are the Store's statements, each prepared on the database at its
// first use (New does no I/O, and the table may not exist before Migrate):
// database/sql then prepares it again on each connection that runs it, not
// at every call, so that a statement is one round trip rather than a
// prepare, an execute and a close. close closes them; after it the
// statements that still run (Complete, Release and Extend, in lease mode)
// are sent unprepared.
type prepared struct {
	db *sql.DB
	// mu is held for reading while a statement runs, and for writing by
	// close, so that no statement runs on a closed one.
	mu     sync.RWMutex
	closed bool
	// pmu guards stmts, which maps a query to its statement.
	pmu   sync.Mutex
	stmts map[string]*sql.Stmt
}

// stmt returns the statement of query, preparing it if it is not yet; the
// caller holds mu for reading, and closed is false.
func (p *prepared) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	p.pmu.Lock()
	st := p.stmts[query]
	p.pmu.Unlock()
	if st != nil {
		return st, nil
	}
	st, err := p.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	p.pmu.Lock()
	defer p.pmu.Unlock()
	if kept := p.stmts[query]; kept != nil {
		st.Close() // another call prepared it meanwhile
		return kept, nil
	}
	if p.stmts == nil {
		p.stmts = make(map[string]*sql.Stmt)
	}
	p.stmts[query] = st
	return st, nil
}

// exec runs query with args, in tx unless it is nil.
func (p *prepared) exec(ctx context.Context, tx *sql.Tx, query string, args ...any) (sql.Result, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		if tx != nil {
			return tx.ExecContext(ctx, query, args...)
		}
		return p.db.ExecContext(ctx, query, args...)
	}
	st, err := p.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	if tx != nil {
		st = tx.StmtContext(ctx, st)
	}
	return st.ExecContext(ctx, args...)
}

// queryRow runs query with args, in tx unless it is nil, and scans the row
// it returns with scan.
func (p *prepared) queryRow(ctx context.Context, tx *sql.Tx, scan func(*sql.Row) error, query string, args ...any) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		if tx != nil {
			return scan(tx.QueryRowContext(ctx, query, args...))
		}
		return scan(p.db.QueryRowContext(ctx, query, args...))
	}
	st, err := p.stmt(ctx, query)
	if err != nil {
		return err
	}
	if tx != nil {
		st = tx.StmtContext(ctx, st)
	}
	return scan(st.QueryRowContext(ctx, args...))
}

// ready prepares the statements of queries that are not yet, so that a
// transaction that runs them then prepares each on its own connection
// rather than waiting for another one of the pool to prepare it on.
func (p *prepared) ready(ctx context.Context, queries ...string) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return nil
	}
	for _, q := range queries {
		if _, err := p.stmt(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// close closes the statements, once those that run have ended.
func (p *prepared) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.pmu.Lock()
	defer p.pmu.Unlock()
	for _, st := range p.stmts {
		st.Close()
	}
	p.stmts = nil
}
