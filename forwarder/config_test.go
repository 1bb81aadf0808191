package forwarder_test

// The forwarder against real databases is tested by the store conformance suite
// (store/storetest), once per store driver.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.uber.org/goleak"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// unusedStore is a store the forwarder is configured with but never calls.
type unusedStore struct{ store.Store }

func (unusedStore) Waker() store.Waker { return nil }
func (unusedStore) Info() store.Info   { return store.Info{Name: "test"} }

type wakingStore struct{ store.Store }

func (wakingStore) Waker() store.Waker { return waker{} }
func (wakingStore) Info() store.Info   { return store.Info{Name: "test"} }

type waker struct{}

func (waker) Listen(context.Context, func(), func(), func(error)) {}

func TestConfigValidation(t *testing.T) {
	_, err := forwarder.New(forwarder.Config{})
	for _, want := range []string{"Store is required", "Publisher is required"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("zero config: got %v, want it to say %q", err, want)
		}
	}
	cases := map[string]forwarder.Config{
		"BatchSize must be at least 1":          {BatchSize: -1},
		"Backoff.Multiplier must be at least 1": {Backoff: forwarder.Backoff{Initial: 1, Max: 2, Multiplier: 0.5}},
		"Backoff.Max":                           {Backoff: forwarder.Backoff{Initial: 2, Max: 1, Multiplier: 2}},
		"Jitter must be in [0, 1)":              {CircuitBackoff: forwarder.Backoff{Initial: 1, Max: 2, Multiplier: 2, Jitter: 1}},
		"contradict":                            {Retention: forwarder.Retention{Keep: true, DeleteOnPublish: true}},
		"PollInterval must be positive":         {PollInterval: -time.Second},
		"IdlePollInterval must be 0 (off) or at least PollInterval": {PollInterval: time.Second, IdlePollInterval: time.Millisecond},
	}
	pub := gochannel.NewGoChannel(gochannel.Config{}, nil)
	defer pub.Close()
	for want, cfg := range cases {
		cfg.Store, cfg.Publisher = unusedStore{}, pub
		if _, err := forwarder.New(cfg); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want an error mentioning %q", err, want)
		}
	}
}

// A store whose writers wake relays is polled as a safety net only; one without wake-ups is
// polled often, since the poll is all there is.
func TestDefaultPollFollowsTheStore(t *testing.T) {
	pub := gochannel.NewGoChannel(gochannel.Config{}, nil)
	defer pub.Close()
	for _, c := range []struct {
		s    store.Store
		want time.Duration
	}{
		{wakingStore{}, forwarder.DefaultPollInterval},
		{unusedStore{}, forwarder.DefaultPollIntervalWithoutWake},
	} {
		f, err := forwarder.New(forwarder.Config{Store: c.s, Publisher: pub})
		if err != nil {
			t.Fatal(err)
		}
		if got := f.Config().PollInterval; got != c.want {
			t.Errorf("%T: poll %s, want %s", c.s, got, c.want)
		}
	}
}
