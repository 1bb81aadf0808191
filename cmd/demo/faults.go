package main

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
)

// faultyPublisher provokes the forwarder's failure modes on purpose.
type faultyPublisher struct {
	message.Publisher
	failEvery  int64 // --fail-publish-every: every Nth publish is refused (a message failure)
	crashEvery int64 // --crash-after-publish: after every Nth publish the relay's database session dies
	killRelay  func()
	calls      atomic.Int64
	published  atomic.Int64
}

func (p *faultyPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.failEvery > 0 && p.calls.Add(1)%p.failEvery == 0 {
		return fmt.Errorf("refused by --fail-publish-every %d", p.failEvery)
	}
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	if p.crashEvery > 0 && p.published.Add(1)%p.crashEvery == 0 {
		// The broker has the message; the relay's session dies before it can mark it published.
		// The pass fails, the rows stay pending and are published again: every inbox absorbs them.
		p.killRelay()
	}
	return nil
}

// killSessions terminates every database session named applicationName.
func killSessions(pool *pgxpool.Pool, applicationName string) {
	_, _ = pool.Exec(context.Background(),
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`,
		applicationName)
}
