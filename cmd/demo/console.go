package main

import (
	"context"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/console"
	"github.com/outboxkit/outboxkit/store"
)

// newConsole is the operator console the demo mounts at /console: sign-in tokens from
// OUTBOXKIT_CONSOLE_TOKENS (name:role:secret,…), or, without any, the person at this machine as an
// operator. It replays consumers' dead letters through the demo's broker and reads their backlog
// there; it runs its jobs until the demo stops.
func newConsole(ctx context.Context, db *store.DB, broker *backends.Backend, topic string) (*console.Handler, error) {
	tokens, err := console.TokensFromEnv()
	if err != nil {
		return nil, err
	}
	cfg := console.Config{Store: db, Prefix: "/console", Auth: console.Auth{Tokens: tokens, LocalOnly: len(tokens) == 0},
		Publisher: broker.Publisher, Environment: "demo", Consumers: map[string][]string{}}
	for _, c := range consumerNames {
		cfg.Consumers[c.name] = []string{topic}
	}
	if broker.ReportsLag() {
		cfg.Lag = func(ctx context.Context, topic, consumer string) (console.Lag, error) {
			l, err := broker.Lag(ctx, topic, consumer)
			return console.Lag{Waiting: l.Waiting, Unacked: l.Unacked, HasUnacked: l.HasUnacked, OldestAge: l.OldestAge, HasAge: l.HasAge}, err
		}
	}
	h, err := console.New(cfg)
	if err != nil {
		return nil, err
	}
	return h, h.Start(ctx)
}
