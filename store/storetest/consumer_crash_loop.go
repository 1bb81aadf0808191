package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/store"
)

// errCrash stands for the death of a consumer process: a handler panics with it, and every
// delivery the "process" had in flight ends unsettled with it.
var errCrash = errors.New("the consumer process died")

// suspects is held by the tests with a suspect of crashing the process, which waits to run alone
// in it — the whole test binary, as the gate is process-wide — while their other deliveries wait
// for the process to die: two of them at once would each wait for the other's deliveries, which
// wait behind the other's suspect, until SoloWait ran out.
var suspects sync.Mutex

// A process handling several messages at once (backends.Options.Unacked > 1, prefetch) that one of
// them crashes, again and again, takes the others in flight with it at each exit, and each exit
// counts a delivery of every one of them. Only the crasher is dead-lettered — after its attempt
// alone in the process, on delivery MaxDeliveries + 2 — and the others are processed once each.
// Not parallel: the attempt alone holds the gate of the whole process.
func deadLetterCrashLoop[TTx any](t *testing.T, h Harness[TTx]) {
	suspects.Lock()
	defer suspects.Unlock()
	e := newConsumerEnv(t, h)
	if strings.HasPrefix(e.Store.Info().Name, "sqlite") {
		t.Skip("SQLite runs one inbox transaction at a time: the deliveries in flight cannot all be in their handlers when the process dies")
	}
	const maxDeliveries, bystanders = 2, 2
	crasher := orderMsg("crasher")
	pending := map[string]*message.Message{crasher.UUID: crasher}
	for i := range bystanders {
		m := orderMsg(fmt.Sprintf("bystander-%d", i))
		pending[m.UUID] = m
	}
	// process is one life of the consumer process.
	type process struct {
		ctx     context.Context
		die     context.CancelFunc
		suspect bool          // every message in it is past MaxDeliveries
		started chan struct{} // a bystander's handler is running
	}
	var current atomic.Pointer[process]
	hf := func(m *message.Message) error {
		p := current.Load()
		switch {
		case m.UUID == crasher.UUID:
			if !p.suspect {
				for range bystanders { // the others are in flight when it crashes the process
					<-p.started
				}
			}
			p.die()
			panic(errCrash)
		case !p.suspect:
			p.started <- struct{}{}
			<-p.ctx.Done() // in flight until the process dies
			panic(errCrash)
		}
		return e.effect("shipping")(m)
	}
	stack := e.stack(t, "shipping", hf, func(c *middleware.StackConfig) {
		c.MaxDeliveries = maxDeliveries
		c.MaxRetries = -1
		c.SoloWait = 30 * time.Second
	})
	for life := 1; len(pending) > 0; life++ {
		if life > maxDeliveries+3 {
			t.Fatalf("%d messages still unsettled after %d lives of the process", len(pending), life-1)
		}
		ctx, die := context.WithCancel(context.Background())
		p := &process{ctx: ctx, die: die, suspect: life > maxDeliveries, started: make(chan struct{}, bystanders)}
		current.Store(p)
		var (
			mu      sync.Mutex
			settled []string
			wg      sync.WaitGroup
		)
		for _, msg := range pending { // every unacknowledged message is delivered again
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() {
					if r := recover(); r != nil && r != errCrash {
						panic(r)
					}
				}()
				m := delivery(msg)
				m.SetContext(ctx)
				if _, err := stack(m); err == nil {
					mu.Lock()
					settled = append(settled, msg.UUID)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		die()
		for _, id := range settled {
			delete(pending, id)
		}
	}
	letters := e.deadLetters(t, store.DeadLetterFilter{Consumer: "shipping"})
	if len(letters) != 1 || letters[0].MessageID != crasher.UUID {
		t.Fatalf("dead letters = %+v; want the crasher's alone", letters)
	}
	if got := letters[0]; got.Attempts != maxDeliveries+2 || !strings.Contains(got.Reason, "alone in the process") {
		t.Fatalf("crasher dead-lettered after %d deliveries (%q), want MaxDeliveries + 2 = %d, after its attempt alone",
			got.Attempts, got.Reason, maxDeliveries+2)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.effects WHERE consumer = ?`, "shipping"); n != bystanders {
		t.Fatalf("%d effects, want each of the %d bystanders once", n, bystanders)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.inbox_deliveries WHERE message_id LIKE ?`, "solo:%"); n != 0 {
		t.Fatalf("%d records of attempts alone left behind", n)
	}
	e.assertGoodMessagesFlow(t, stack, 10)
}

// crashOnce delivers msg through stack once with a handler that crashes the process: the delivery
// is counted and never settled.
func crashOnce(t *testing.T, stack message.HandlerFunc, msg *message.Message) {
	t.Helper()
	defer func() {
		if r := recover(); r != errCrash {
			t.Fatalf("the delivery ended with %v, want the crash", r)
		}
	}()
	_, err := stack(delivery(msg))
	t.Fatalf("the delivery returned %v; the handler was to crash", err)
}

// A suspect waits at most SoloWait for the deliveries in progress to end. Past it, it is neither
// run beside them — were it the crasher, it would take them down again — nor dead-lettered, since
// nothing has shown that it crashes the process: the delivery fails, the broker delivers it again,
// and nothing of an attempt alone is recorded, so the redelivery still gets its attempt alone.
// Not parallel: the suspect waits for the deliveries of the whole process.
func deadLetterSoloWaitTimeout[TTx any](t *testing.T, h Harness[TTx]) {
	suspects.Lock()
	defer suspects.Unlock()
	e := newConsumerEnv(t, h)
	if strings.HasPrefix(e.Store.Info().Name, "sqlite") {
		t.Skip("SQLite runs one inbox transaction at a time: the suspect cannot be counted while the long delivery runs")
	}
	const maxDeliveries = 1
	var (
		crash   atomic.Bool
		runs    atomic.Int32 // the suspect's handler calls
		alone   atomic.Int32 // Deliveries the suspect's handler saw, when it ran
		started = make(chan struct{})
		finish  = make(chan struct{})
	)
	suspect := orderMsg("suspect")
	billing := func(m *message.Message) error {
		runs.Add(1)
		if crash.Load() {
			panic(errCrash)
		}
		alone.Store(int32(middleware.Deliveries(m.Context())))
		return e.effect("billing")(m)
	}
	tune := func(soloWait time.Duration) func(*middleware.StackConfig) {
		return func(c *middleware.StackConfig) {
			c.MaxDeliveries, c.MaxRetries, c.SoloWait = maxDeliveries, -1, soloWait
		}
	}
	crash.Store(true)
	crashOnce(t, e.stack(t, "billing", billing, tune(30*time.Second)), suspect) // delivery 1
	crash.Store(false)

	// A long delivery of another consumer holds the gate.
	long := e.stack(t, "shipping", func(m *message.Message) error {
		close(started)
		select {
		case <-finish:
		case <-time.After(30 * time.Second):
			return errors.New("the test never let the long delivery end")
		}
		return e.effect("shipping")(m)
	})
	longDone := make(chan error, 1)
	go func() {
		_, err := long(delivery(orderMsg("long")))
		longDone <- err
	}()
	<-started

	_, err := e.stack(t, "billing", billing, tune(200*time.Millisecond))(delivery(suspect)) // delivery 2
	if err == nil || !strings.Contains(err.Error(), "other deliveries still ran after 200ms") {
		t.Fatalf("the suspect's delivery returned %v; want it to fail, the long delivery still in progress after SoloWait", err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the suspect's handler ran %d times, want once (its crash): past SoloWait it must not run", n)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.inbox_deliveries WHERE message_id LIKE ?`, "solo:%"); n != 0 {
		t.Fatalf("%d records of an attempt alone; the suspect never started one", n)
	}
	if letters := e.deadLetters(t, store.DeadLetterFilter{Consumer: "billing"}); len(letters) != 0 {
		t.Fatalf("dead letters %+v; a suspect that could not run alone has not shown it crashes the process", letters)
	}
	select {
	case err := <-longDone:
		t.Fatalf("the long delivery ended (%v) before the test let it", err)
	default:
	}
	close(finish)
	if err := <-longDone; err != nil {
		t.Fatalf("the long delivery: %v", err)
	}

	if _, err := e.stack(t, "billing", billing, tune(30*time.Second))(delivery(suspect)); err != nil { // delivery 3
		t.Fatalf("the suspect's redelivery: %v", err)
	}
	if runs.Load() != 2 || alone.Load() != 3 {
		t.Fatalf("the suspect's handler ran %d times, the last on delivery %d; want its attempt alone on delivery 3",
			runs.Load(), alone.Load())
	}
	if n := e.count(t, "effects", "billing", suspect.UUID); n != 1 {
		t.Fatalf("%d effects of the suspect, want 1", n)
	}
	if letters := e.deadLetters(t, store.DeadLetterFilter{}); len(letters) != 0 {
		t.Fatalf("dead letters %+v, want none", letters)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.inbox_deliveries WHERE message_id LIKE ?`, "solo:%"); n != 0 {
		t.Fatalf("%d records of attempts alone left behind", n)
	}
}
