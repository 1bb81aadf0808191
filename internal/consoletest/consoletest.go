// Package consoletest is what the console's tests share: the page tests beside the code in
// console/, and the browser tests in integration/console, which live in the integration module so
// that chromedp is no requirement of the library's. A test package in another module cannot see
// console's _test.go files, so the seeded store, the handler and its tokens, and the broker a
// replay reaches are here, once.
package consoletest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/console"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

// The secrets of Tokens: alice is an operator, carol a viewer.
const (
	OperatorToken = "operator-secret-0123456789"
	ViewerToken   = "viewer-secret-0123456789ab"
)

// Tokens sign in alice (OperatorToken) and carol (ViewerToken).
var Tokens = []console.Token{{Name: "alice", Role: console.Operator, Secret: OperatorToken}, {Name: "carol", Role: console.Viewer, Secret: ViewerToken}}

// OpenStore is a migrated SQLite store of the test's own.
func OpenStore(t testing.TB) *sqlitestore.Store {
	t.Helper()
	s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "console.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.DB().Close() })
	if _, err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// refusing is a broker that refuses every message.
type refusing struct{}

func (refusing) Publish(string, ...*message.Message) error {
	return errors.New("broker refused the message: too large")
}
func (refusing) Close() error { return nil }

// Seed fills s as an incident would: billing refuses a customer (a group of 12), a payload no
// consumer decodes (on every consumer), a non-UTF-8 payload, a huge one, and 3 outbox rows the
// broker refused.
func Seed(t testing.TB, s *sqlitestore.Store) {
	t.Helper()
	ctx := context.Background()
	now := time.Now().Add(-time.Hour)
	letter := func(consumer, id, key, eventType string, seq int, payload []byte, reason string, at time.Time) {
		md, _ := json.Marshal(map[string]string{"outboxkit_event_type": eventType, "outboxkit_partition_key": key, "outboxkit_seq": fmt.Sprint(seq),
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
		if err := s.Session().DeadLetter(ctx, store.InboxDeadLetter{Consumer: consumer, Topic: "shop.orders", MessageID: id, Payload: payload,
			Metadata: md, Reason: reason, Deliveries: 1, Now: at}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 12; i++ {
		letter("billing", fmt.Sprintf("0190f7e2-0000-7000-8000-%012d", i), fmt.Sprintf("order-%05d", 100+i), "OrderPlaced", 100+i,
			[]byte(fmt.Sprintf(`{"order_id":"order-%05d","customer":"c-0042","total_cents":%d}`, 100+i, 1000+i)),
			`customer "c-0042" has no billing account (--reject-customer)`, now.Add(time.Duration(i)*time.Minute))
	}
	for _, c := range []string{"shipping", "billing", "search"} {
		letter(c, "0190f7e2-0000-7000-8000-poison000001", "order-00999", "OrderPlaced", 999, []byte("not json"),
			"decode OrderPlaced: invalid character 'o' in literal null (expecting 'u')", now.Add(30*time.Minute))
	}
	letter("search", "0190f7e2-0000-7000-8000-binary000001", "order-00500", "OrderPaid", 500, []byte{0xff, 0xfe, 0x00, 'b', 'i', 'n'},
		"decode OrderPaid: invalid character 'ÿ' looking for beginning of value", now.Add(40*time.Minute))
	huge := []byte(`{"blob":"` + strings.Repeat("x", 200<<10) + `"}`)
	letter("search", "0190f7e2-0000-7000-8000-huge00000001", "order-00501", "OrderPaid", 501, huge,
		"payload too large for the search index (204812 bytes)", now.Add(41*time.Minute))

	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := pipeline.NewPublisher(s, tx, pipeline.PublisherConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := pub.Publish("shop.orders", pipeline.NewEvent("OrderPlaced", fmt.Sprintf("order-%05d", 700+i), []byte(`{"big":true}`))); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	f, err := forwarder.New(forwarder.Config{Store: s, Publisher: refusing{}, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.DispatchBatch(ctx); err != nil {
		t.Fatal(err)
	}
}

// NewHandler is a started console on s under /ops/console, signing in Tokens, with the seeded
// consumers; tune adjusts its configuration first. It is stopped when the test ends.
func NewHandler(t testing.TB, s store.Store, tune ...func(*console.Config)) *console.Handler {
	t.Helper()
	cfg := console.Config{Store: s, Prefix: "/ops/console", Auth: console.Auth{Tokens: Tokens}, Environment: "test",
		Consumers: map[string][]string{"shipping": {"shop.orders"}, "billing": {"shop.orders"}, "search": {"shop.orders"}}}
	for _, fn := range tune {
		fn(&cfg)
	}
	h, err := console.New(cfg)
	return started(t, h, err)
}

// started starts h, made with err, and stops it when the test ends.
func started(t testing.TB, h *console.Handler, err error) *console.Handler {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return h
}

// Recorder is the broker a replay publishes to.
type Recorder struct {
	mu   sync.Mutex
	msgs []*message.Message
}

func (r *Recorder) Publish(_ string, msgs ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, msgs...)
	return nil
}
func (r *Recorder) Close() error { return nil }

// Sent is what was published so far.
func (r *Recorder) Sent() []*message.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*message.Message(nil), r.msgs...)
}
