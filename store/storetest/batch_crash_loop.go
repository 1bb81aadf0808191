package storetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/store"
)

// A process running two batch consumers, one of which gets a message that crashes the process again
// and again, with the other's messages in flight at each exit. Once past MaxDeliveries, a message
// runs alone in the process: no batch or delivery of either consumer is in a handler while a suspect
// is in its own — each handler counts the handlers in progress as it starts, and for a while after
// (a window for a missing gate to show; with the gate nothing can start in it). The crasher is
// dead-lettered after its attempt alone, on delivery MaxDeliveries + 2; the messages that died
// with it, however often they were counted, are processed once each and never dead-lettered.
// Not parallel: the attempts alone hold the gate of the whole process.
func batchCrashLoop[TTx any](t *testing.T, h Harness[TTx]) {
	suspects.Lock()
	defer suspects.Unlock()
	e := newConsumerEnv(t, h)
	if strings.HasPrefix(e.Store.Info().Name, "sqlite") {
		t.Skip("SQLite runs one inbox transaction at a time: the other consumer's batch cannot be in flight when the process dies")
	}
	const (
		maxDeliveries = 2
		window        = 300 * time.Millisecond
	)
	crasher, beforeCrasher := orderMsg("crasher"), orderMsg("billing-innocent")
	pending := map[string][]*message.Message{ // consumer → its unsettled messages, in arrival order
		"billing":  {beforeCrasher, crasher},
		"shipping": {orderMsg("shipping-0"), orderMsg("shipping-1")},
	}
	// process is one life of the process.
	type process struct {
		ctx      context.Context
		die      context.CancelFunc
		suspects bool          // deliveries may be past MaxDeliveries: what is in flight finishes
		inFlight chan struct{} // a shipping handler is in flight
		once     sync.Once
	}
	var (
		current      atomic.Pointer[process]
		running      atomic.Int32 // handlers in progress
		aloneRunning atomic.Int32 // suspects' handlers in progress
		crasherAlone atomic.Bool
		mu           sync.Mutex
		beside       []string
	)
	violation := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		beside = append(beside, fmt.Sprintf(format, args...))
	}
	handler := func(consumer string) message.HandlerFunc {
		return middleware.NoPublish(func(m *message.Message) error {
			p := current.Load()
			n := running.Add(1)
			defer running.Add(-1)
			alone := middleware.Deliveries(m.Context()) > maxDeliveries
			if alone {
				if n != 1 {
					violation("suspect %s started with %d other handlers in progress", m.UUID, n-1)
				}
				aloneRunning.Add(1)
				defer aloneRunning.Add(-1)
				if m.UUID == crasher.UUID {
					crasherAlone.Store(true)
				}
			} else if aloneRunning.Load() > 0 {
				violation("%s (delivery %d) started beside a suspect", m.UUID, middleware.Deliveries(m.Context()))
			}
			if p.ctx.Err() != nil {
				panic(errCrash) // the process is gone
			}
			if p.suspects && waitFor(window, func() bool {
				if alone {
					return running.Load() > 1
				}
				return aloneRunning.Load() > 0
			}) {
				violation("%s (delivery %d, alone %v) ran beside another", m.UUID, middleware.Deliveries(m.Context()), alone)
			}
			switch {
			case m.UUID == crasher.UUID:
				if !alone {
					select { // the other consumer's message is in flight when it crashes the process
					case <-p.inFlight:
					case <-time.After(20 * time.Second):
						violation("no shipping handler in flight in 20s")
					}
				}
				p.die()
				panic(errCrash)
			case consumer == "shipping" && !p.suspects:
				p.once.Do(func() { close(p.inFlight) })
				<-p.ctx.Done() // in flight until the process dies
				panic(errCrash)
			}
			return e.effect(consumer)(m)
		})
	}
	var processed []string
	handedOut := map[string]bool{} // the broker says whether it delivered a message before
	for life := 1; len(pending["billing"])+len(pending["shipping"]) > 0; life++ {
		if life > maxDeliveries+4 {
			t.Fatalf("still unsettled after %d lives of the process: %v", life-1, pending)
		}
		ctx, die := context.WithCancel(context.Background())
		p := &process{ctx: ctx, die: die, suspects: life > maxDeliveries, inFlight: make(chan struct{})}
		current.Store(p)
		if p.suspects { // a first delivery, which the shipping consumer takes in a batch, beside the suspects
			pending["shipping"] = append([]*message.Message{orderMsg(fmt.Sprintf("shipping-fresh-%d", life))}, pending["shipping"]...)
		}
		var stops []func()
		delivered := map[string][]*message.Message{}
		for _, consumer := range []string{"billing", "shipping"} {
			for _, msg := range pending[consumer] {
				m := delivery(msg)
				m.SetContext(outboxkit.WithRedelivered(ctx, handedOut[msg.UUID]))
				handedOut[msg.UUID] = true
				delivered[consumer] = append(delivered[consumer], m)
			}
			stops = append(stops, e.startBatches(t, consumer, newFeed(delivered[consumer]...), handler(consumer), func(c *middleware.BatchConfig) {
				c.MaxDeliveries, c.SoloWait = maxDeliveries, 30*time.Second
			}))
		}
		for _, consumer := range []string{"billing", "shipping"} {
			nacked := settled(t, delivered[consumer])
			var left []*message.Message
			for _, msg := range pending[consumer] {
				if slices.Contains(nacked, msg.UUID) {
					left = append(left, msg)
				} else {
					processed = append(processed, msg.UUID)
				}
			}
			pending[consumer] = left
		}
		for _, stop := range stops {
			stop()
		}
		die()
	}
	if len(beside) > 0 {
		t.Fatalf("a suspect ran beside other handlers of the process:\n%s", strings.Join(beside, "\n"))
	}
	letters := e.deadLetters(t, store.DeadLetterFilter{})
	if len(letters) != 1 || letters[0].MessageID != crasher.UUID {
		t.Fatalf("dead letters = %+v; want the crasher's alone", letters)
	}
	if got := letters[0]; got.Attempts != maxDeliveries+2 || !strings.Contains(got.Reason, "alone in the process") {
		t.Fatalf("crasher dead-lettered after %d deliveries (%q), want MaxDeliveries + 2 = %d, after its attempt alone",
			got.Attempts, got.Reason, maxDeliveries+2)
	}
	if !crasherAlone.Load() {
		t.Fatal("the crasher never ran alone")
	}
	for _, id := range processed {
		if id == crasher.UUID {
			continue
		}
		if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.effects WHERE message_id = ?`, id); n != 1 {
			t.Fatalf("%s applied %d times, want once", id, n)
		}
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.effects`); n != len(processed)-1 {
		t.Fatalf("%d effects, want one for each of the %d innocent messages", n, len(processed)-1)
	}
	if n := e.MustInt(t, `SELECT count(*) FROM {{schema}}.inbox_deliveries WHERE message_id LIKE ?`, "solo:%"); n != 0 {
		t.Fatalf("%d records of attempts alone left behind", n)
	}
}
