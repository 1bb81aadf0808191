package forwarder

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/outboxkit/outboxkit/store"
)

// DefaultHeartbeatInterval is how often a running relay reads the pauses and reports itself.
const DefaultHeartbeatInterval = 2 * time.Second

// pauseSet is the pauses a relay last read: topics no relay publishes, and whether relays of its
// name are paused.
type pauseSet struct {
	topics map[string]bool
	relay  bool
}

// relayState is what the heartbeat reads and writes beside the passes.
type relayState struct {
	pauses     atomic.Pointer[pauseSet]
	changedMu  sync.Mutex
	changed    chan struct{} // closed when the heartbeat reads pauses other than the ones in force
	started    time.Time
	mu         sync.Mutex
	published  int64
	byTopic    map[string]int64
	openSince  time.Time // when the circuit opened; zero while closed
	pausesSeen time.Time
}

// paused reports whether a row of topic must not be published now: a pause set in the middle of a
// pass is honoured from the next row, as soon as the heartbeat has read it. The claim itself
// leaves paused rows out of every pass that starts after the pause.
func (f *Forwarder) paused(topic string) bool {
	p := f.relay.pauses.Load()
	return p != nil && (p.relay || p.topics[topic])
}

// equal reports whether p and o pause the same things (nil: nothing read yet, none in force).
func (p *pauseSet) equal(o *pauseSet) bool {
	pr, or := p != nil && p.relay, o != nil && o.relay
	var pt, ot map[string]bool
	if p != nil {
		pt = p.topics
	}
	if o != nil {
		ot = o.topics
	}
	if pr != or || len(pt) != len(ot) {
		return false
	}
	for t := range pt {
		if !ot[t] {
			return false
		}
	}
	return true
}

// pausing reports whether any pause that concerns this relay is in force: its Name's, or a
// topic's.
func (f *Forwarder) pausing() bool {
	p := f.relay.pauses.Load()
	return p != nil && (p.relay || len(p.topics) > 0)
}

// relayPaused reports whether relays of this forwarder's Name are paused, as of the pauses the
// heartbeat last read.
func (f *Forwarder) relayPaused() bool {
	p := f.relay.pauses.Load()
	return p != nil && p.relay
}

// pausesChanged returns a channel closed once the heartbeat reads pauses other than the ones in
// force when it was called.
func (f *Forwarder) pausesChanged() <-chan struct{} {
	f.relay.changedMu.Lock()
	defer f.relay.changedMu.Unlock()
	if f.relay.changed == nil {
		f.relay.changed = make(chan struct{})
	}
	return f.relay.changed
}

// countPublished adds a pass's published rows to the per-topic totals the heartbeat reports.
func (f *Forwarder) countPublished(rows []store.OutboxRow, published []publishedRow) {
	if len(published) == 0 {
		return
	}
	topics := make(map[int64]string, len(rows))
	for _, r := range rows {
		topics[r.Seq] = r.Topic
	}
	f.relay.mu.Lock()
	defer f.relay.mu.Unlock()
	if f.relay.byTopic == nil {
		f.relay.byTopic = map[string]int64{}
	}
	for _, p := range published {
		f.relay.byTopic[topics[p.seq]]++
	}
	f.relay.published += int64(len(published))
}

// heartbeatLoop reads the pauses and reports the relay every HeartbeatInterval until ctx ends:
// beside Run's passes, or a source's run (RunSource).
func (f *Forwarder) heartbeatLoop(ctx context.Context, rc store.RelayControl) {
	host, _ := os.Hostname()
	ticker := time.NewTicker(f.cfg.HeartbeatInterval)
	defer ticker.Stop()
	failing := false
	for {
		err := f.heartbeat(ctx, rc, host)
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			failing = true // said once per outage: the passes report the database's state too
			f.cfg.Logger.Error("Cannot read the pauses or report the relay's heartbeat; retrying", err, watermill.LogFields{"forwarder": f.cfg.Name})
		case err == nil:
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

func (f *Forwarder) heartbeat(ctx context.Context, rc store.RelayControl, host string) error {
	// Taken before the read: every pause set before this instant is in what the read returns, so
	// the heartbeat can say it was seen.
	seen := f.cfg.Now()
	pauses, err := rc.Pauses(ctx)
	if err != nil {
		return err
	}
	set := &pauseSet{topics: map[string]bool{}}
	for _, p := range pauses {
		switch {
		case p.Scope == store.PauseTopic:
			set.topics[p.Name] = true
		case p.Scope == store.PauseRelay && p.Name == f.cfg.Name:
			set.relay = true
		}
	}
	if old := f.relay.pauses.Swap(set); !set.equal(old) {
		f.relay.changedMu.Lock()
		if f.relay.changed != nil {
			close(f.relay.changed)
			f.relay.changed = nil
		}
		f.relay.changedMu.Unlock()
	}
	now := f.cfg.Now()
	h := f.Health()
	f.relay.mu.Lock()
	f.relay.pausesSeen = seen
	switch {
	case h.CircuitOpen && f.relay.openSince.IsZero():
		f.relay.openSince = now
	case !h.CircuitOpen:
		f.relay.openSince = time.Time{}
	}
	beat := store.RelayBeat{Owner: f.owner, Name: f.cfg.Name, Host: host, PID: os.Getpid(), Started: f.relay.started, At: now,
		LastPass: h.LastPass, LastPublish: h.LastPublish, CircuitOpenSince: f.relay.openSince, PublishedTotal: f.relay.published,
		PublishedByTopic: make(map[string]int64, len(f.relay.byTopic)), PausesSeen: seen}
	for t, n := range f.relay.byTopic {
		beat.PublishedByTopic[t] = n
	}
	f.relay.mu.Unlock()
	if h.Blocked != nil {
		beat.Blocked = h.Blocked.Error()
	}
	return rc.RelayHeartbeat(ctx, beat)
}
