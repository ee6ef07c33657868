package crash_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idempotency/internal/testkit/testproc"
)

// stepNames are the steps of crashserver -steps, in the order they run.
var stepNames = []string{"charge", "email", "order"}

// TestStepsCrash is TestCrash with a handler of three steps (crashserver
// -steps): a charge, sent through the client to a payment service behind
// the middleware (in the test's process, which is not killed); an email,
// a row in a table without a unique key; and the order's row and lines, in
// a transactional step (pgstore.RunStep) when the records are in
// PostgreSQL, in a plain step committing its own transaction otherwise.
//
// For each step it counts the orders whose step's effect happened more than
// once, in two kinds, told apart by what the store held when the step's
// function began (the server writes it down before each effect): a step
// the store held as done that ran again, which must never happen; and a
// step cut between its effect and its record, which runs again after the
// takeover (the physical limit of a step whose effect is outside the
// store's transaction). The charge's key is derived from the step's name,
// so a charge cut mid-run is answered by the payment service's replay; the
// transactional step's writes roll back with the killed holder's record,
// so it is never repeated either.
//
// Without steps (-direct), the same effects are repeated by every takeover
// of an order killed after them, and by the retry of an order answered 503
// after them (its lease lost, say): the contrast. Under RefuseAbandoned no
// effect happens twice, and a step started by a killed holder is answered
// "outcome unknown" for that step: the test counts those answers by step,
// and the whole-request ones (a holder killed before it recorded a step).
func TestStepsCrash(t *testing.T) {
	bin := testproc.Build(t, "github.com/idemkit/idempotency/internal/tests/crash/crashserver")
	type mode struct {
		name, kind     string
		direct, refuse bool
	}
	modes := []mode{
		{name: "pg-lease", kind: "pg-lease"},
		{name: "redis-lease", kind: "redis-lease"},
		{name: "pg-lease, without steps", kind: "pg-lease", direct: true},
		{name: "pg-lease, refuse", kind: "pg-lease", refuse: true},
	}
	if *long {
		// Without steps under RefuseAbandoned, every takeover is a
		// whole-request "outcome unknown": the figure that steps
		// narrow to the step that was running.
		modes = append(modes,
			mode{name: "redis-lease, without steps", kind: "redis-lease", direct: true},
			mode{name: "redis-lease, refuse", kind: "redis-lease", refuse: true},
			mode{name: "pg-lease, without steps, refuse", kind: "pg-lease", direct: true, refuse: true},
			mode{name: "redis-lease, without steps, refuse", kind: "redis-lease", direct: true, refuse: true})
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			if m.refuse {
				requireAbandonedReported(t, m.kind)
			}
			r := newCrashRun(t, bin, m.kind, runSize())
			tables := newStepTables(t, r)
			pay := startOrdersService(t, tables.charges, tables.chargeLines)
			r.args = append(r.args, "-steps", "-downstream", pay.url)
			if m.direct {
				r.args = append(r.args, "-direct")
			}
			if m.refuse {
				r.args = append(r.args, "-abandoned", "refuse")
			}
			res, answers := r.exercise(t)
			sr := tables.count(t, answers)
			t.Logf("payment service: %d requests, %d replays; not written: %q", pay.requests.Load(), pay.replays.Load(), pay.failed())
			t.Logf("%s: %d orders, %d crashes (orders in flight at the kills: %v, %d in all); %d half done, %d answered but absent; answers seen: %s",
				m.name, res.orders, len(res.killedInflight), res.killedInflight, sum(res.killedInflight), sr.halfDone, sr.lost, r.answers)
			for _, name := range stepNames {
				if s := sr.steps[name]; m.direct {
					t.Logf("%s: %s: %d effects; %d orders with it more than once (%d extra)", m.name, name, s.effects, s.twice, s.extra)
				} else {
					t.Logf("%s: step %s", m.name, s)
				}
			}
			t.Logf("%s: %d orders resumed past a replayed charge; %d whole-request \"outcome unknown\" answers (%d of them charged)",
				m.name, sr.resumed, sr.wholeUnknown, sr.wholeUnknownRan)

			assert.Zero(t, sr.halfDone, "orders half done")
			assert.Zero(t, sr.lost, "orders answered whose effects are not all in the database")
			for _, name := range stepNames {
				s := sr.steps[name]
				assert.Zero(t, s.recorded, "orders in which step %s ran while the store held it as done", name)
				assert.LessOrEqual(t, s.extra, sum(res.killedInflight), "step %s: more effects repeated than orders were in flight at the kills", name)
				switch {
				case m.refuse && !m.direct:
					assert.Zero(t, s.extra, "step %s: effects repeated under RefuseAbandoned (orders %v)", name, s.twiceRefs)
				case m.refuse:
					// Without steps, an order whose lease was lost
					// after its email answers 503; the released key
					// runs again from the top, and sends the email
					// again: no takeover, nothing to refuse.
				default:
					assert.Zero(t, s.unknown, "step %s: \"outcome unknown\" answers without the refuse policy", name)
				}
			}
			if !m.refuse {
				assert.Zero(t, sr.wholeUnknown, "\"outcome unknown\" answers without the refuse policy")
			}
			// The charge's key is the same in every run of an order:
			// derived from the incoming key, and, in a step, from its
			// name.
			assert.Zero(t, sr.steps["charge"].extra, "charges repeated at the payment service (orders %v)", sr.steps["charge"].twiceRefs)
			switch {
			case m.direct && m.refuse:
				assert.Positive(t, sr.wholeUnknown, "no \"outcome unknown\" without steps under RefuseAbandoned: the crashes missed the handlers")
			case m.direct:
				assert.Positive(t, sr.steps["email"].extra, "no email repeated without steps: the crashes missed the handlers")
			default:
				assert.Positive(t, sr.resumed, "no order resumed past a recorded step: the crashes missed the steps")
				if m.kind == "pg-lease" {
					assert.Zero(t, sr.steps["order"].extra, "orders written twice by the transactional step (orders %v)", sr.steps["order"].twiceRefs)
				}
			}
		})
	}
}

// stepTables are the tables of a -steps run besides the orders and their
// lines (sanitized names).
type stepTables struct {
	r                                  *crashRun
	emails, runs, charges, chargeLines string
}

func newStepTables(t *testing.T, r *crashRun) *stepTables {
	id := func(suffix string) string { return pgx.Identifier{r.name + suffix}.Sanitize() }
	s := &stepTables{r: r, emails: id("_emails"), runs: id("_runs"), charges: id("_charges"), chargeLines: id("_charges_lines")}
	_, err := r.pool.Exec(context.Background(),
		"CREATE TABLE "+s.emails+" (id bigserial PRIMARY KEY, ref text NOT NULL);"+
			"CREATE TABLE "+s.runs+" (ref text NOT NULL, step text NOT NULL, recorded bool NOT NULL, abandoned int NOT NULL);"+
			"CREATE TABLE "+s.charges+" (id bigserial PRIMARY KEY, ref text NOT NULL, lines int NOT NULL);"+
			"CREATE TABLE "+s.chargeLines+" (order_id bigint NOT NULL, n int NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r.pool.Exec(ctx, "DROP TABLE IF EXISTS "+s.emails+", "+s.runs+", "+s.charges+", "+s.chargeLines)
	})
	return s
}

// stepTally is what one step did over a run.
type stepTally struct {
	name string
	// effects is the number of the step's effects (rows); twice the
	// orders that have more than one, extra the effects beyond one per
	// order.
	effects, twice, extra int
	twiceRefs             []string
	// recorded counts the orders in which the step's function ran while
	// the store held the step as done: a completed step run again.
	recorded int
	// cut counts the orders whose effect happened more than once, every
	// run of it begun while the store held no record of the step: cut
	// between its effect and its record.
	cut int
	// reran counts the orders whose step's function ran more than once
	// (a charge run again is answered by the payment service's replay; a
	// transactional step run again had its first run rolled back).
	reran int
	// unknown counts the final "outcome unknown" answers naming the step;
	// unknownRan those of them whose step's effect is there.
	unknown, unknownRan int
}

func (s *stepTally) String() string {
	return fmt.Sprintf("%s: %d effects; %d orders with it more than once (%d extra): %d completed steps run again, %d cut mid-run; %d orders ran it more than once; %d \"outcome unknown\" answers (%d of them with the effect)",
		s.name, s.effects, s.twice, s.extra, s.recorded, s.cut, s.reran, s.unknown, s.unknownRan)
}

// stepsResult is what the database holds after a -steps run.
type stepsResult struct {
	steps    map[string]*stepTally
	halfDone int // orders whose lines are not all written
	lost     int // answered 201, an effect it names absent
	// wholeUnknown counts the whole-request "outcome unknown" answers (a
	// holder lost before it recorded a step); wholeUnknownRan those of
	// them charged.
	wholeUnknown, wholeUnknownRan int
	// resumed counts the orders in which a later holder ran a step but
	// not the charge: the charge was replayed from its record.
	resumed int
}

// count reads a -steps run's effects and step runs from the database and
// checks each answer against them.
func (s *stepTables) count(t *testing.T, answers map[int]string) stepsResult {
	ctx := context.Background()
	pool := s.r.pool
	res := stepsResult{steps: map[string]*stepTally{}}
	// id → ref of each step's effects, and effects per ref.
	ids := map[string]map[int64]string{}
	per := map[string]map[string]int{}
	for name, table := range map[string]string{"charge": s.charges, "email": s.emails, "order": s.r.orders} {
		res.steps[name] = &stepTally{name: name}
		ids[name], per[name] = map[int64]string{}, map[string]int{}
		rows, err := pool.Query(ctx, "SELECT id, ref FROM "+table)
		require.NoError(t, err)
		for rows.Next() {
			var (
				id  int64
				ref string
			)
			require.NoError(t, rows.Scan(&id, &ref))
			ids[name][id] = ref
			per[name][ref]++
		}
		require.NoError(t, rows.Err())
	}
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+s.r.orders+" o WHERE o.lines <> (SELECT count(*) FROM "+s.r.lines+" l WHERE l.order_id = o.id)").Scan(&res.halfDone))

	type runs struct {
		n, recorded  int
		maxAbandoned int
	}
	ran := map[string]map[string]*runs{} // step → ref → runs
	for _, name := range stepNames {
		ran[name] = map[string]*runs{}
	}
	rows, err := pool.Query(ctx, "SELECT ref, step, count(*), count(*) FILTER (WHERE recorded), max(abandoned) FROM "+s.runs+" GROUP BY ref, step")
	require.NoError(t, err)
	for rows.Next() {
		var (
			ref, name string
			r         runs
		)
		require.NoError(t, rows.Scan(&ref, &name, &r.n, &r.recorded, &r.maxAbandoned))
		require.Contains(t, ran, name, "a run of an unknown step")
		ran[name][ref] = &r
	}
	require.NoError(t, rows.Err())

	for _, name := range stepNames {
		st := res.steps[name]
		for ref, n := range per[name] {
			st.effects += n
			r := ran[name][ref]
			if n > 1 {
				st.twice++
				st.extra += n - 1
				st.twiceRefs = append(st.twiceRefs, ref)
				if r == nil || r.recorded == 0 {
					st.cut++
				}
			}
		}
		for _, r := range ran[name] {
			if r.recorded > 0 {
				st.recorded++
			}
			if r.n > 1 {
				st.reran++
			}
		}
	}
	later := map[string]int{} // ref → the most lost holders a run of email or order saw
	for _, name := range stepNames[1:] {
		for ref, r := range ran[name] {
			later[ref] = max(later[ref], r.maxAbandoned)
		}
	}
	for ref, l := range later {
		if c := ran["charge"][ref]; l > 0 && (c == nil || c.maxAbandoned < l) {
			res.resumed++
		}
	}

	for i, a := range answers {
		ref := "ref-" + strconv.Itoa(i)
		if outcomeUnknown(http.StatusConflict, []byte(a)) {
			var p struct{ Step string }
			require.NoError(t, json.Unmarshal([]byte(a), &p), "order %d: %s", i, a)
			if p.Step == "" {
				res.wholeUnknown++
				res.wholeUnknownRan += min(per["charge"][ref], 1)
				continue
			}
			st, ok := res.steps[p.Step]
			require.True(t, ok, "order %d: \"outcome unknown\" for an unknown step: %s", i, a)
			st.unknown++
			st.unknownRan += min(per[p.Step][ref], 1)
			continue
		}
		var p struct {
			Ref                  string
			Charge, Email, Order int64
		}
		require.NoError(t, json.Unmarshal([]byte(a), &p), "order %d: %s", i, a)
		require.Equal(t, ref, p.Ref, "order %d's answer", i)
		if ids["charge"][p.Charge] != ref || ids["email"][p.Email] != ref || ids["order"][p.Order] != ref {
			res.lost++
		}
	}
	return res
}
