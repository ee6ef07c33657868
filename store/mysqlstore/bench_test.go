package mysqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/internal/sqlrecord"
	"github.com/idemkit/idempotency/internal/testkit/teststores"
)

// BenchmarkStatements compares, on one server and in one run, the store's
// first execution (Claim of a new key, then Complete) and replay (Claim of
// a completed key) with the minimal statements that do the same on a table
// of the same columns: an INSERT and an UPDATE, and a SELECT, each run as
// an application writes it ("minimal") and prepared once ("prepared"), as
// the Store's statements are.
//
//	go test ./store/mysqlstore -run '^$' -bench BenchmarkStatements -benchtime 2000x -count 5
func BenchmarkStatements(b *testing.B) {
	ctx := context.Background()
	db := teststores.MySQLDB(b, false)
	s := teststores.MySQLOn(b, db, teststores.UniqueName(b, "mysqlstore_bench_"))
	minimal := teststores.UniqueName(b, "mysqlstore_minimal_")
	if _, err := db.Exec("CREATE TABLE `" + minimal + "` (scope VARBINARY(1024) NOT NULL, `key` VARBINARY(1024) NOT NULL, fingerprint BLOB NOT NULL," +
		" token BIGINT, lease_until BIGINT, expires_at BIGINT, status INT, headers LONGBLOB, body LONGBLOB, PRIMARY KEY (scope, `key`)) ENGINE=InnoDB"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Exec("DROP TABLE `" + minimal + "`") })
	resp := &engine.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":42,"status":"created"}`)}
	headers := sqlrecord.EncodeHeader(resp.Header)
	run := 0
	b.Run("first/store", func(b *testing.B) {
		b.ReportAllocs()
		run++
		for i := range b.N {
			id := engine.ID{Scope: "bench", Key: fmt.Sprint(run, "-", i)}
			c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			if err != nil || c.Status != engine.Acquired {
				b.Fatal(c.Status, err)
			}
			if err := s.Complete(ctx, id, c.Token, resp, time.Hour); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, v := range variants {
		insert := v.statement(b, db, "INSERT INTO `"+minimal+"` (scope, `key`, fingerprint, token, lease_until, expires_at) VALUES (?, ?, ?, ?, ?, ?)")
		update := v.statement(b, db, "UPDATE `"+minimal+"` SET status = ?, headers = ?, body = ?, expires_at = ? WHERE scope = ? AND `key` = ? AND token = ?")
		b.Run("first/"+v.name, func(b *testing.B) {
			b.ReportAllocs()
			run++
			for i := range b.N {
				key := []byte(fmt.Sprint(run, "-", i))
				now := time.Now().UnixMicro()
				if err := insert.exec(ctx, []byte("bench"), key, []byte("fp"), i, now+60e6, now+3600e6); err != nil {
					b.Fatal(err)
				}
				if err := update.exec(ctx, resp.Status, headers, resp.Body, now+3600e6, []byte("bench"), key, i); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	replayID := engine.ID{Scope: "bench", Key: "replayed"}
	c, err := s.Claim(ctx, replayID, "fp", time.Minute, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Complete(ctx, replayID, c.Token, resp, time.Hour); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO `"+minimal+"` (scope, `key`, fingerprint, status, headers, body) VALUES (?, ?, ?, ?, ?, ?)",
		[]byte("bench"), []byte("replayed"), []byte("fp"), resp.Status, headers, resp.Body); err != nil {
		b.Fatal(err)
	}
	b.Run("replay/store", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if c, err := s.Claim(ctx, replayID, "fp", time.Minute, time.Hour); err != nil || c.Status != engine.Completed {
				b.Fatal(c.Status, err)
			}
		}
	})
	for _, v := range variants {
		sel := v.statement(b, db, "SELECT fingerprint, status, headers, body FROM `"+minimal+"` WHERE scope = ? AND `key` = ?")
		b.Run("replay/"+v.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				var (
					fp, h, body []byte
					status      sql.NullInt64
				)
				if err := sel.queryRow(ctx, []byte("bench"), []byte("replayed")).Scan(&fp, &status, &h, &body); err != nil {
					b.Fatal(err)
				}
				if _, err := sqlrecord.DecodeHeader(h); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// variants are the two ways the minimal statements run: "minimal", as an
// application writes them (db.ExecContext, which the driver parses, or
// prepares and closes, at every call), and "prepared", prepared once, as
// the Store's statements are.
var variants = []variant{{"minimal", false}, {"prepared", true}}

type variant struct {
	name     string
	prepared bool
}

// statement is query on db, prepared if the variant is.
func (v variant) statement(b *testing.B, db *sql.DB, query string) statement {
	if !v.prepared {
		return statement{db: db, query: query}
	}
	st, err := db.Prepare(query)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	return statement{db: db, query: query, st: st}
}

type statement struct {
	db    *sql.DB
	query string
	st    *sql.Stmt
}

func (s statement) exec(ctx context.Context, args ...any) error {
	var err error
	if s.st != nil {
		_, err = s.st.ExecContext(ctx, args...)
	} else {
		_, err = s.db.ExecContext(ctx, s.query, args...)
	}
	return err
}

func (s statement) queryRow(ctx context.Context, args ...any) *sql.Row {
	if s.st != nil {
		return s.st.QueryRowContext(ctx, args...)
	}
	return s.db.QueryRowContext(ctx, s.query, args...)
}

// BenchmarkPaired takes the same measures as BenchmarkStatements with the
// three alternating at every iteration (in turn first), each timed apart,
// so that the ratios compare operations run at the same moments: on a
// loaded machine, whose disk's fsyncs take from a fraction of a millisecond
// to several, a ratio of two sub-benchmarks run one after the other swings
// with it. It reports each one's mean (store-µs, minimal-µs, prepared-µs)
// and the store's ratios to the two others.
//
//	go test ./store/mysqlstore -run '^$' -bench BenchmarkPaired -benchtime 1000x -count 5
func BenchmarkPaired(b *testing.B) {
	ctx := context.Background()
	db := teststores.MySQLDB(b, false)
	s := teststores.MySQLOn(b, db, teststores.UniqueName(b, "mysqlstore_bench_"))
	minimal := teststores.UniqueName(b, "mysqlstore_minimal_")
	if _, err := db.Exec("CREATE TABLE `" + minimal + "` (scope VARBINARY(1024) NOT NULL, `key` VARBINARY(1024) NOT NULL, fingerprint BLOB NOT NULL," +
		" token BIGINT, lease_until BIGINT, expires_at BIGINT, status INT, headers LONGBLOB, body LONGBLOB, PRIMARY KEY (scope, `key`)) ENGINE=InnoDB"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Exec("DROP TABLE `" + minimal + "`") })
	resp := &engine.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":42,"status":"created"}`)}
	headers := sqlrecord.EncodeHeader(resp.Header)
	run := 0
	first := []func(i int) error{func(i int) error {
		id := engine.ID{Scope: "bench", Key: fmt.Sprint(run, "-", i)}
		c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
		if err != nil || c.Status != engine.Acquired {
			return fmt.Errorf("claim: %v %w", c.Status, err)
		}
		return s.Complete(ctx, id, c.Token, resp, time.Hour)
	}}
	for vi, v := range variants {
		insert := v.statement(b, db, "INSERT INTO `"+minimal+"` (scope, `key`, fingerprint, token, lease_until, expires_at) VALUES (?, ?, ?, ?, ?, ?)")
		update := v.statement(b, db, "UPDATE `"+minimal+"` SET status = ?, headers = ?, body = ?, expires_at = ? WHERE scope = ? AND `key` = ? AND token = ?")
		first = append(first, func(i int) error {
			key := []byte(fmt.Sprint(run, "-", vi, "-", i))
			now := time.Now().UnixMicro()
			if err := insert.exec(ctx, []byte("bench"), key, []byte("fp"), i, now+60e6, now+3600e6); err != nil {
				return err
			}
			return update.exec(ctx, resp.Status, headers, resp.Body, now+3600e6, []byte("bench"), key, i)
		})
	}
	b.Run("first", func(b *testing.B) {
		run++
		paired(b, first)
	})
	replayID := engine.ID{Scope: "bench", Key: "replayed"}
	c, err := s.Claim(ctx, replayID, "fp", time.Minute, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Complete(ctx, replayID, c.Token, resp, time.Hour); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO `"+minimal+"` (scope, `key`, fingerprint, status, headers, body) VALUES (?, ?, ?, ?, ?, ?)",
		[]byte("bench"), []byte("replayed"), []byte("fp"), resp.Status, headers, resp.Body); err != nil {
		b.Fatal(err)
	}
	replay := []func(int) error{func(int) error {
		if c, err := s.Claim(ctx, replayID, "fp", time.Minute, time.Hour); err != nil || c.Status != engine.Completed {
			return fmt.Errorf("replay: %v %w", c.Status, err)
		}
		return nil
	}}
	for _, v := range variants {
		sel := v.statement(b, db, "SELECT fingerprint, status, headers, body FROM `"+minimal+"` WHERE scope = ? AND `key` = ?")
		replay = append(replay, func(int) error {
			var (
				fp, h, body []byte
				status      sql.NullInt64
			)
			if err := sel.queryRow(ctx, []byte("bench"), []byte("replayed")).Scan(&fp, &status, &h, &body); err != nil {
				return err
			}
			_, err := sqlrecord.DecodeHeader(h)
			return err
		})
	}
	b.Run("replay", func(b *testing.B) { paired(b, replay) })
}

// paired runs the store's operation and the minimal statements' two
// variants in turn, each iteration starting with the next one, and reports
// each one's mean time and the store's ratios to the others.
func paired(b *testing.B, ops []func(i int) error) {
	names := []string{"store", "minimal", "prepared"}
	spent := make([]time.Duration, len(ops))
	b.ReportAllocs()
	for i := range b.N {
		for j := range ops {
			k := (i + j) % len(ops)
			start := time.Now()
			if err := ops[k](i); err != nil {
				b.Fatal(names[k], err)
			}
			spent[k] += time.Since(start)
		}
	}
	for k, d := range spent {
		b.ReportMetric(float64(d.Microseconds())/float64(b.N), names[k]+"-µs")
		if k > 0 && d > 0 {
			b.ReportMetric(float64(spent[0])/float64(d), "store/"+names[k])
		}
	}
}

// BenchmarkSteps times a first execution (Claim of a new key, then
// Complete) without steps and with three steps of 256 bytes, the two in
// turn at every iteration, and reports each one's mean and what a step
// adds (step-µs).
//
//	go test ./store/mysqlstore -run '^$' -bench BenchmarkSteps -benchtime 2000x -count 5
func BenchmarkSteps(b *testing.B) {
	ctx := context.Background()
	s := teststores.MySQLOn(b, teststores.MySQLDB(b, false), teststores.UniqueName(b, "mysqlstore_bench_"))
	resp := &engine.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":42,"status":"created"}`)}
	result := make([]byte, 256)
	run := time.Now().UnixNano()
	const steps = 3
	var spent [2]time.Duration
	b.ReportAllocs()
	for i := range b.N {
		for j := range 2 {
			n := (i + j) % 2 * steps
			id := engine.ID{Scope: "bench-steps", Key: fmt.Sprint(run, "-", i, "-", n)}
			start := time.Now()
			c, err := s.Claim(ctx, id, "fp", time.Minute, time.Hour)
			if err != nil || c.Status != engine.Acquired {
				b.Fatal(c.Status, err)
			}
			for k := range n {
				if err := s.SaveStep(ctx, id, c.Token, engine.Step{Name: fmt.Sprint("step-", k), Fingerprint: "fp", Done: true, Result: result}); err != nil {
					b.Fatal(err)
				}
			}
			if err := s.Complete(ctx, id, c.Token, resp, time.Hour); err != nil {
				b.Fatal(err)
			}
			spent[n/steps] += time.Since(start)
		}
	}
	b.ReportMetric(float64(spent[0].Microseconds())/float64(b.N), "none-µs")
	b.ReportMetric(float64(spent[1].Microseconds())/float64(b.N), "three-µs")
	b.ReportMetric(float64((spent[1]-spent[0]).Microseconds())/float64(b.N*steps), "step-µs")
}
