package mysqlbinlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// The relay group's lock is GET_LOCK(name) on the connection that writes the group's
// checkpoints: the server holds it for as long as that connection lives, and hands it to the
// relay waiting for it the moment the connection ends.
const (
	// lockWait is how long one GET_LOCK waits for the group's lock before the relay asks again
	// (and looks at its context).
	lockWait = time.Second
	// lockLease is the lock connection's wait_timeout: the server ends the connection, and so
	// releases the lock, once it has heard nothing from the relay for that long (its host gone
	// without closing its connections). The relay holding the lock stops publishing when it has
	// not known the lock held for half of it, before the server can give the lock to another.
	lockLease = 10 * time.Second
	// lockCheck is how often the relay holding the lock asks the server whether it still does.
	lockCheck = 250 * time.Millisecond
)

// errLockHeld is a session that found the group's lock held by another relay.
var errLockHeld = errors.New("another relay of the group holds its lock")

// errLockLost is a session ended because the relay no longer knows it holds the group's lock.
var errLockLost = errors.New("lost the relay group's lock")

// lease is lockLease, or the tests' shorter one.
func (r *Relay) lease() time.Duration {
	if r.hooks.lease > 0 {
		return r.hooks.lease
	}
	return lockLease
}

// takeLock takes the relay group's lock on conn, waiting as long as another relay holds it. It
// returns nil once the lock is taken, or when ctx ends (ctx.Err() then says so).
func (r *Relay) takeLock(ctx context.Context, conn *sql.Conn) error {
	// The lease: a relay, standing by or not, that vanishes without closing its connection loses
	// the lock within it — a GET_LOCK that succeeds for a relay gone meanwhile too.
	lease := max(int(r.lease()/time.Second), 1)
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("SET SESSION wait_timeout = %d", lease)); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("set the lock connection's wait_timeout: %w", err)
	}
	waiting := false
	for {
		err := r.lock(ctx, conn)
		if err == nil {
			if waiting {
				r.log.Info("Binlog relay took the relay group's lock, which another relay held until now", r.fields.Add(watermill.LogFields{"lock": r.lockName}))
			}
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		if !errors.Is(err, errLockHeld) {
			return err
		}
		if !waiting {
			r.log.Info("Another relay of the group reads the binary log: waiting for it", r.fields.Add(watermill.LogFields{"lock": r.lockName}))
			waiting = true
		}
	}
}

// lock takes the relay group's lock on conn, waiting up to lockWait for another relay to
// release it.
func (r *Relay) lock(ctx context.Context, conn *sql.Conn) error {
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", r.lockName, int(lockWait/time.Second)).Scan(&got); err != nil {
		return fmt.Errorf("take the relay group's lock %s: %w", r.lockName, err)
	}
	if got.Int64 != 1 {
		return errLockHeld
	}
	return nil
}

// groupLock is the relay group's lock as a reading session holds it: the connection that took
// it, whose uses it takes one at a time (its checks, the checkpoints), and when it was last
// known held. Once it is not, the session's context ends with the loss as its cause: the
// dispatcher publishes no more row, and no checkpoint is written.
type groupLock struct {
	r    *Relay
	conn *sql.Conn
	// use is held by whoever uses conn: a check, or a checkpoint.
	use sync.Mutex

	mu     sync.Mutex
	heldAt time.Time // when a statement the server answered on conn was sent: the lock was held then
	err    error     // the loss, once found
	fence  context.CancelCauseFunc
}

// watchLock checks that the session's connection holds the group's lock, then checks it again
// every lockCheck until ctx ends, in a goroutine that stop ends and waits for. The returned
// context ends with ctx, or when the lock is found lost, with the loss as its cause.
func (s *session) watchLock(ctx context.Context) (lctx context.Context, stop func(), err error) {
	l := &groupLock{r: s.r, conn: s.conn, heldAt: time.Now()}
	lctx, l.fence = context.WithCancelCause(ctx)
	s.lock = l
	if err := l.check(); err != nil {
		err = l.lost(err)
		return lctx, func() {}, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(lockCheck)
		defer tick.Stop()
		for {
			select {
			case <-lctx.Done():
				return
			case <-tick.C:
			}
			if err := l.check(); err != nil {
				_ = l.lost(err)
				return
			}
		}
	}()
	return lctx, func() { l.fence(nil); <-done }, nil
}

// check asks the server whether conn holds the lock, and waits for the answer no later than half
// the lease after the lock was last known held. Not ended by the session's context: a check
// cancelled would close the connection, which the last checkpoint, at the session's end, needs.
func (l *groupLock) check() error {
	l.use.Lock()
	defer l.use.Unlock()
	at := time.Now()
	deadline := l.knownHeld().Add(l.r.lease() / 2)
	if !at.Before(deadline) {
		return l.stale(at)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var ours sql.NullInt64
	err := l.conn.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?) = CONNECTION_ID()", l.r.lockName).Scan(&ours)
	switch {
	case err != nil && ctx.Err() != nil:
		return l.stale(time.Now())
	case err != nil:
		return fmt.Errorf("its connection failed: %w", err)
	case !ours.Valid:
		return errors.New("the server says no connection holds it")
	case ours.Int64 != 1:
		return errors.New("the server says another connection holds it")
	}
	l.held(at)
	return nil
}

func (l *groupLock) stale(now time.Time) error {
	return fmt.Errorf("its connection has not answered for %s, beyond half the lease (%s): "+
		"the server may end it and give the lock to another relay", now.Sub(l.knownHeld()).Round(time.Millisecond), l.r.lease())
}

func (l *groupLock) knownHeld() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.heldAt
}

// held records that the lock was held when a statement sent at was answered.
func (l *groupLock) held(at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if at.After(l.heldAt) {
		l.heldAt = at
	}
}

// fresh returns nil while the lock was known held within half the lease, else the loss (and
// ends the session): the dispatcher asks before each round.
func (l *groupLock) fresh() error {
	if err := l.lostErr(); err != nil {
		return err
	}
	if now := time.Now(); now.Sub(l.knownHeld()) >= l.r.lease()/2 {
		return l.lost(l.stale(now))
	}
	return nil
}

// lostErr is the loss, once found.
func (l *groupLock) lostErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// lost records the loss of the lock, for why, and ends the session; it returns the loss.
func (l *groupLock) lost(why error) error {
	l.mu.Lock()
	if l.err == nil {
		l.err = fmt.Errorf("%w %s (%w): another relay of the group may read the binary log now. "+
			"This one stopped publishing and waits for the lock again; the rows it published since its last checkpoint "+
			"are published again by the relay that reads on (a duplicate, never a loss)", errLockLost, l.r.lockName, why)
	}
	err := l.err
	l.mu.Unlock()
	l.fence(err)
	return err
}
