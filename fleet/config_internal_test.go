package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/store"
)

type kindStore struct {
	store.Store
	name  string
	waker store.Waker
}

func (s kindStore) Info() store.Info   { return store.Info{Name: s.name} }
func (s kindStore) Waker() store.Waker { return s.waker }

type someWaker struct{}

func (someWaker) Listen(context.Context, func(), func(), func(error)) {}

// An idle outbox is polled seldom where its writers wake its relay, often enough for a new event
// to go within seconds where they do not (a SQLite writer wakes only the relays of its own
// process); what the configuration sets stays.
func TestForwarderConfig_IdlePollFollowsTheStore(t *testing.T) {
	for _, c := range []struct {
		name     string
		s        store.Store
		template forwarder.Config
		want     time.Duration
	}{
		{"postgres woken by NOTIFY", kindStore{name: "postgres (database/sql)", waker: someWaker{}}, forwarder.Config{}, DefaultIdlePoll},
		{"postgres without LISTEN", kindStore{name: "postgres (database/sql)"}, forwarder.Config{}, DefaultIdlePollWithoutWake},
		{"mysql", kindStore{name: "mysql"}, forwarder.Config{}, DefaultIdlePollWithoutWake},
		{"sqlite", kindStore{name: "sqlite", waker: someWaker{}}, forwarder.Config{}, DefaultIdlePollWithoutWake},
		{"a poll longer than the default", kindStore{name: "mysql"}, forwarder.Config{PollInterval: 5 * time.Second}, 5 * time.Second},
		{"set by the configuration", kindStore{name: "mysql"}, forwarder.Config{IdlePollInterval: time.Minute}, time.Minute},
	} {
		m := &Member{cfg: Config{Forwarder: c.template}.withDefaults()}
		cfg := m.forwarderConfig(&relay{m: m, outbox: Outbox{Name: "o"}}, c.s)
		if cfg.IdlePollInterval != c.want {
			t.Errorf("%s: IdlePollInterval %s, want %s", c.name, cfg.IdlePollInterval, c.want)
		}
		if cfg.HeartbeatInterval != DefaultRelayHeartbeat {
			t.Errorf("%s: HeartbeatInterval %s, want %s", c.name, cfg.HeartbeatInterval, DefaultRelayHeartbeat)
		}
		if _, err := forwarder.New(cfg); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}
