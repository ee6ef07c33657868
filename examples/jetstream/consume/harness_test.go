package consume_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idempotency/engine"
	"github.com/idemkit/idempotency/examples/jetstream/consume"
	"github.com/idemkit/idempotency/internal/testkit/servicetest"
)

var (
	flagMessages = flag.Int("messages", 200, "messages published in each run of the redelivery tests")
	flagSeed     = flag.Uint64("seed", 1, "seed that decides which deliveries die")
)

// envNATSURL points the tests at a NATS server with JetStream.
const envNATSURL = "IDEMPOTENCY_NATS_URL"

// Timing of the runs: the consumer redelivers an unacknowledged message
// after ackWait; a dead holder's lease ends after lease, longer than
// ackWait, so that a live holder on a loaded machine keeps its lease through
// a stall of a few hundred milliseconds: a message that comes back before
// the lease ends is refused as in flight, and naked until it is free.
const (
	ackWait    = 300 * time.Millisecond
	lease      = 500 * time.Millisecond
	retryDelay = 50 * time.Millisecond
	workers    = 4
	// maxFated is the last delivery of a message that may die or fail:
	// the ones after it live, so that every run ends.
	maxFated = 3
)

// fate is what happens to one delivery of a message.
type fate int

const (
	live fate = iota
	// failBefore: the effect fails before it does anything (a transient
	// error): the door releases the key, the handler naks.
	failBefore
	// dieBefore: the process dies inside the door's function, before the
	// effect: its claim is left in flight until its lease ends.
	dieBefore
	// dieAfterEffect: the process dies inside the door's function, after
	// the effect and before the door stores its result. No door can tell
	// this from dieBefore: the takeover sees Abandoned > 0.
	dieAfterEffect
	// dieBeforeAck: the process dies after the door returned (the result
	// is stored), before it acknowledges.
	dieBeforeAck
	// slow: the effect takes longer than AckWait, so the broker delivers
	// the message again, to another worker, while it runs.
	slow
	numFates
)

func (f fate) String() string {
	return [...]string{"live", "fail-before", "die-before-effect", "die-after-effect", "die-before-ack", "slow"}[f]
}

// fates gives each fate but live its probability per delivery.
type fates map[fate]float64

// of returns the fate of delivery n of the message with id: a function of
// the seed, the ID and n, so that a run can be told again (the order of the
// deliveries, and so which worker has which, is the scheduler's).
func (fs fates) of(seed uint64, id string, n uint64) fate {
	if n > maxFated {
		return live
	}
	h := fnv.New64a()
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], seed)
	binary.LittleEndian.PutUint64(b[8:], n)
	h.Write(b[:])
	h.Write([]byte(id))
	// FNV's high bits hardly change with the last bytes: mix them
	// (splitmix64's finalizer).
	z := h.Sum64()
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	x := float64(z>>11) / (1 << 53)
	for f := fate(1); f < numFates; f++ {
		if x < fs[f] {
			return f
		}
		x -= fs[f]
	}
	return live
}

// process is one incarnation of a consumer process: the Func it runs
// messages through, and what its death and its end do.
type process struct {
	run consume.Func
	// die cuts the process off: nothing it does from then on reaches the
	// idempotency store, as if it had crashed.
	die func()
	// stop frees what the process holds, dead or alive.
	stop func()
}

// effects counts the effect of each message: every run of it, raw, as a
// system that does not deduplicate would see them.
type effects struct {
	mu sync.Mutex
	n  map[string]int
}

func (e *effects) do(key string) {
	e.mu.Lock()
	e.n[key]++
	e.mu.Unlock()
}

func (e *effects) done(key string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[key] > 0
}

// runConfig is one run: n messages published, delivered to workers whose
// deliveries meet fates.
type runConfig struct {
	n     int
	fates fates
	// newProcess starts a process whose Func runs effect. It runs on the
	// workers' goroutines.
	newProcess func(effect consume.Func) (process, error)
	// checkOwn makes the effect look for its own earlier run when the
	// lease says an earlier holder was lost (Abandoned > 0), as the door
	// tells an effect to do.
	checkOwn bool
}

// result is what a run counted.
type result struct {
	published    int // messages
	republished  int // publishes again of a message, which the stream dropped as duplicates
	deliveries   int // every delivery, redeliveries included
	redeliveries int // deliveries with NumDelivered > 1
	effects      map[string]int
	deaths       [numFates]int // deliveries that met each fate
	abandoned    int           // effects run with Abandoned > 0
	skipped      int           // of which found their own effect and did not run it again
	actions      map[consume.Action]int
	terms        map[string]string // message ID: why it was terminated
}

func (r *result) total() int {
	n := 0
	for _, c := range r.effects {
		n += c
	}
	return n
}

// exactlyOnce returns the messages whose effect did not run exactly once.
func (r *result) notOnce() []string {
	var bad []string
	for i := range r.published {
		id := msgID(i)
		if c := r.effects[id]; c != 1 {
			bad = append(bad, fmt.Sprintf("%s:%d", id, c))
		}
	}
	sort.Strings(bad)
	return bad
}

func (r *result) String() string {
	var deaths []string
	for f := fate(1); f < numFates; f++ {
		deaths = append(deaths, fmt.Sprintf("%v=%d", f, r.deaths[f]))
	}
	return fmt.Sprintf("published=%d republished=%d deliveries=%d redeliveries=%d "+
		"effects=%d (%d extra) abandoned-takeovers=%d own-check-skips=%d acks=%d naks=%d terms=%d fates: %s",
		r.published, r.republished, r.deliveries, r.redeliveries,
		r.total(), r.total()-r.published, r.abandoned, r.skipped,
		r.actions[consume.Ack], r.actions[consume.Nak], r.actions[consume.Term], strings.Join(deaths, " "))
}

func msgID(i int) string { return fmt.Sprintf("order-%04d", i) }

type fateKey struct{}

// abandoned returns how many holders of the message's record were lost
// before this one, as the door's lease says.
func abandoned(ctx context.Context) int {
	l, _ := engine.LeaseFromContext(ctx)
	return l.Abandoned
}

// delivery is what the effect knows of the delivery it runs for.
type delivery struct {
	fate fate
	// met records that the fate happened; die also kills the process.
	met, die func()
}

// run publishes cfg.n messages to a stream of its own, consumes them with
// workers processes that die as cfg.fates says, and returns what it counted
// once every message is acknowledged or terminated.
func run(t *testing.T, cfg runConfig) *result {
	t.Helper()
	js, cons, subject := newConsumer(t, ackWait)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	res := &result{actions: map[consume.Action]int{}, terms: map[string]string{}}
	for i := range cfg.n {
		data := []byte(fmt.Sprintf(`{"order":%d,"amount":%d}`, i, 100+i))
		if _, err := js.Publish(ctx, subject, data, jetstream.WithMsgID(msgID(i))); err != nil {
			t.Fatalf("Publish(%s): %v", msgID(i), err)
		}
		res.published++
		if i%10 == 0 {
			// A publisher that retries after a lost PubAck: within the
			// stream's duplicate window the stream drops it.
			ack, err := js.Publish(ctx, subject, data, jetstream.WithMsgID(msgID(i)))
			if err != nil {
				t.Fatalf("Publish(%s) again: %v", msgID(i), err)
			}
			if !ack.Duplicate {
				t.Fatalf("Publish(%s) again: PubAck.Duplicate = false, want true", msgID(i))
			}
			res.republished++
		}
	}

	var mu sync.Mutex // guards res
	eff := &effects{n: map[string]int{}}
	settled := map[string]bool{}
	errTransient := errors.New("effect failed before it did anything")
	errDied := errors.New("process died")
	effect := func(ctx context.Context, id engine.ID, data []byte) error {
		d, _ := ctx.Value(fateKey{}).(*delivery)
		if abandoned(ctx) > 0 {
			mu.Lock()
			res.abandoned++
			mu.Unlock()
			if cfg.checkOwn && eff.done(id.Key) {
				mu.Lock()
				res.skipped++
				mu.Unlock()
				return nil
			}
		}
		switch d.fate {
		case failBefore:
			d.met()
			return errTransient
		case dieBefore:
			d.die()
			return errDied
		}
		eff.do(id.Key)
		switch d.fate {
		case slow:
			d.met()
			// Work that outlasts AckWait (not a wait for a condition).
			time.Sleep(ackWait * 3 / 2)
		case dieAfterEffect:
			d.die()
			return errDied
		}
		return nil
	}

	var wg sync.WaitGroup
	iters := make([]jetstream.MessagesContext, workers)
	for w := range workers {
		it, err := cons.Messages(jetstream.PullMaxMessages(1))
		if err != nil {
			t.Fatal(err)
		}
		iters[w] = it
		wg.Add(1)
		go func() {
			defer wg.Done()
			worker(t, it, cfg, effect, func(f func()) { mu.Lock(); f(); mu.Unlock() }, res, settled)
		}()
	}
	stopAll := func() {
		for _, it := range iters {
			it.Stop()
		}
		wg.Wait()
	}

	// Poll until every message is settled and the consumer has nothing
	// left to deliver or wait for.
	idle := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0
	}
	deadline := time.Now().Add(time.Minute + time.Duration(cfg.n)*20*time.Millisecond)
	for {
		mu.Lock()
		n := len(settled)
		mu.Unlock()
		if n == cfg.n {
			if idle() {
				break
			}
		}
		if time.Now().After(deadline) {
			stopAll()
			res.effects = eff.n
			t.Fatalf("run did not settle: %d of %d messages settled; %v", n, cfg.n, res)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopAll()
	res.effects = eff.n
	return res
}

// worker consumes messages from it until it is stopped, in a process that
// it starts again each time one dies.
func worker(t *testing.T, it jetstream.MessagesContext, cfg runConfig, effect consume.Func,
	locked func(func()), res *result, settled map[string]bool,
) {
	var p process
	var h *consume.Handler
	start := func() bool {
		var err error
		if p, err = cfg.newProcess(effect); err != nil {
			t.Errorf("new process: %v", err)
			return false
		}
		if h, err = consume.New(p.run, consume.WithRetryDelay(retryDelay)); err != nil {
			p.stop()
			t.Errorf("consume.New: %v", err)
			return false
		}
		return true
	}
	if !start() {
		return
	}
	defer func() { p.stop() }()
	for {
		msg, err := it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			return
		}
		if err != nil {
			continue // a missed heartbeat: the iterator pulls again
		}
		md, err := msg.Metadata()
		if err != nil {
			t.Errorf("Metadata: %v", err)
			continue
		}
		id := msg.Headers().Get(jetstream.MsgIDHeader)
		f := cfg.fates.of(*flagSeed, id, md.NumDelivered)
		var dead atomic.Bool
		d := &delivery{fate: f}
		d.met = func() { locked(func() { res.deaths[f]++ }) }
		d.die = func() {
			d.met()
			dead.Store(true)
			p.die()
		}
		locked(func() {
			res.deliveries++
			if md.NumDelivered > 1 {
				res.redeliveries++
			}
		})
		dec := h.Process(context.WithValue(context.Background(), fateKey{}, d), msg)
		if f == dieBeforeAck && dec.Action == consume.Ack {
			d.die()
		}
		if dead.Load() {
			// The process is gone with whatever it held: no ack, no nak.
			// The broker delivers the message again after AckWait.
			p.stop()
			if !start() {
				p = process{stop: func() {}}
				return
			}
			continue
		}
		if err := dec.Settle(msg); err != nil {
			t.Logf("%s: %v", id, err)
			continue
		}
		locked(func() {
			res.actions[dec.Action]++
			if dec.Action == consume.Term {
				res.terms[id] = dec.Reason
			}
			if dec.Action != consume.Nak {
				settled[id] = true
			}
		})
	}
}

// newConsumer makes a stream of its own, deleted when t ends, and a durable
// consumer on it with ackWait, and returns them with the stream's subject.
func newConsumer(t *testing.T, ackWait time.Duration) (jetstream.JetStream, jetstream.Consumer, string) {
	t.Helper()
	nc := connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, subject := uniqueStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       stream,
		Subjects:   []string{subject},
		Storage:    jetstream.MemoryStorage,
		Duplicates: 2 * time.Minute,
	})
	if err != nil {
		servicetest.Unavailable(t, "NATS JetStream", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, stream); err != nil {
			t.Errorf("DeleteStream(%s): %v", stream, err)
		}
	})
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       "billing",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxDeliver:    -1,
		MaxAckPending: 1000,
	})
	if err != nil {
		t.Fatal(err)
	}
	return js, cons, subject
}

// connect returns a connection to the test NATS server, closed when t ends.
func connect(t *testing.T) *nats.Conn {
	t.Helper()
	url := os.Getenv(envNATSURL)
	if url == "" {
		url = "nats://127.0.0.1:4222"
	}
	nc, err := nats.Connect(url, nats.Timeout(2*time.Second), nats.MaxReconnects(0))
	if err != nil {
		servicetest.Unavailable(t, "NATS", fmt.Errorf("%w (point the tests at one with %s)", err, envNATSURL))
	}
	t.Cleanup(nc.Close)
	return nc
}

// uniqueStream returns a stream name and a subject that no other test or
// run uses.
func uniqueStream(t *testing.T) (stream, subject string) {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	x := hex.EncodeToString(b)
	return "IDEMPOTENCY_T_" + strings.ToUpper(x), "idempotency-t." + x + ".orders"
}

// noDoor is a process that runs the effect directly, as a consumer without
// the door does.
func noDoor(effect consume.Func) (process, error) {
	return process{run: effect, die: func() {}, stop: func() {}}, nil
}
