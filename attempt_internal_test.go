package idempotency

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newAttempt returns a timed attemptCtx of a call, with parent as the
// caller's context.
func newAttempt(parent context.Context) *attemptCtx {
	c := &call{ctx: parent}
	c.first.init(parent, c, time.Minute, 0)
	return &c.first
}

// waitDone fails the test unless ctx is done within a few seconds.
func waitDone(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("context not done")
	}
}

func TestAttemptCtxTimeout(t *testing.T) {
	a := newAttempt(context.Background())
	require.True(t, a.timed)
	child, cancel := context.WithCancel(a)
	defer cancel()
	ran := make(chan struct{})
	context.AfterFunc(a, func() { close(ran) })
	stopped := context.AfterFunc(a, func() { t.Error("a stopped AfterFunc ran") })
	assert.True(t, stopped(), "stop() before the cancellation")
	assert.NoError(t, a.Err())
	assert.Same(t, a.call, a.Value(callKey{}), "Value(callKey{})")

	a.cancel(context.Canceled, true)
	waitDone(t, a)
	waitDone(t, child)
	<-ran
	assert.ErrorIs(t, a.Err(), context.Canceled)
	assert.ErrorIs(t, child.Err(), context.Canceled)
	assert.True(t, a.timedOut())
	assert.False(t, stopped(), "stop() after the cancellation")

	late := make(chan struct{})
	stop := context.AfterFunc(a, func() { close(late) })
	<-late
	assert.False(t, stop(), "stop() of an AfterFunc given after the cancellation")
}

func TestAttemptCtxFollowsParent(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	a := newAttempt(parent)
	child, cancelChild := context.WithCancel(a)
	defer cancelChild()
	assert.True(t, a.linked(), "a derived context makes a follow its parent")

	cancel()
	waitDone(t, child)
	waitDone(t, a)
	assert.ErrorIs(t, a.Err(), context.Canceled)
	assert.False(t, a.timedOut())
	assert.False(t, a.linked())
}

func TestAttemptCtxUnlink(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := newAttempt(parent)
	a.Done()
	require.True(t, a.linked())
	a.unlink()
	assert.False(t, a.linked())
	// The next hop of a redirect follows the parent again.
	child, cancelChild := context.WithCancel(a)
	defer cancelChild()
	assert.True(t, a.linked())
	cancel()
	waitDone(t, child)
}

func TestAttemptCtxErrWithoutDone(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	a := newAttempt(parent)
	cancel()
	// Nobody asked for Done, so nothing follows the parent: Err still sees
	// it, and closes Done to match.
	assert.ErrorIs(t, a.Err(), context.Canceled)
	waitDone(t, a)
}

func TestAttemptCtxUntimed(t *testing.T) {
	parent, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c := &call{ctx: parent}
	c.first.init(parent, c, time.Minute, 0)
	a := &c.first
	assert.False(t, a.timed, "timed although the caller's deadline comes first")
	assert.Equal(t, parent.Done(), a.Done())
	d1, _ := a.Deadline()
	d2, _ := parent.Deadline()
	assert.Equal(t, d2, d1)
	ran := make(chan struct{})
	context.AfterFunc(a, func() { close(ran) })
	cancel()
	<-ran
	assert.ErrorIs(t, a.Err(), context.Canceled)

	var off attemptCtx
	off.init(context.Background(), c, 0, 0)
	assert.False(t, off.timed, "timed without an attempt timeout")
	assert.Nil(t, off.Done())
}

func TestAttemptTimeouts(t *testing.T) {
	q := &attemptTimeouts{d: 200 * time.Millisecond} // long enough for stop() to come first under load

	// One that runs out of time, alone in the queue.
	a := newAttempt(context.Background())
	require.True(t, q.start(a))
	assert.False(t, q.start(a), "start() of an attempt already waiting")
	waitDone(t, a)
	assert.True(t, a.timedOut())
	assert.False(t, q.stop(a), "stop() after the time ran out")

	// The timer is set again for an attempt that comes after the queue
	// emptied, and an attempt that ends in time is left alone.
	b := newAttempt(context.Background())
	c := newAttempt(context.Background())
	require.True(t, q.start(b))
	require.True(t, q.start(c))
	assert.True(t, q.stop(b))
	waitDone(t, c)
	assert.True(t, c.timedOut())
	assert.NoError(t, b.Err(), "an attempt stopped in time")
	assert.False(t, b.timedOut())

	// An attempt can be timed again, as the next hop of a redirect is.
	require.True(t, q.start(b))
	waitDone(t, b)
	assert.True(t, b.timedOut())
}

func TestAttemptTimeoutsConcurrent(t *testing.T) {
	q := &attemptTimeouts{d: 250 * time.Millisecond} // as above
	const n = 200
	inTime := make([]*attemptCtx, n)
	late := make([]*attemptCtx, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			inTime[i] = newAttempt(context.Background())
			late[i] = newAttempt(context.Background())
			q.start(late[i])
			q.start(inTime[i])
			if !q.stop(inTime[i]) {
				t.Errorf("attempt %d: stop() = false right after start()", i)
			}
		})
	}
	wg.Wait()
	for i := range n {
		waitDone(t, late[i])
		assert.True(t, late[i].timedOut(), "attempt %d timed out", i)
		assert.False(t, q.stop(late[i]))
		assert.NoError(t, inTime[i].Err(), "attempt %d ended in time", i)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	assert.Nil(t, q.head, "queue after all attempts ended")
	assert.Nil(t, q.tail)
}
