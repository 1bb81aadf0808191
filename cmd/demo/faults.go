package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/forwarder"
)

// faultyPublisher provokes the forwarder's failure modes on purpose.
type faultyPublisher struct {
	message.Publisher
	failEvery  int64 // --fail-publish-every: every Nth publish is refused (a message failure)
	crashEvery int64 // --crash-after-publish: every Nth pass that publishes dies before marking
	calls      atomic.Int64
	passes     atomic.Int64
}

func (p *faultyPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.failEvery > 0 && p.calls.Add(1)%p.failEvery == 0 {
		return fmt.Errorf("refused by --fail-publish-every %d", p.failEvery)
	}
	return p.Publisher.Publish(topic, msgs...)
}

// Check is the broker publisher's own, so that the relay watches the broker through this wrapper
// (forwarder.Config.CircuitWatch).
func (p *faultyPublisher) Check(ctx context.Context) error {
	if c, ok := p.Publisher.(interface{ Check(context.Context) error }); ok {
		return c.Check(ctx)
	}
	return nil
}

// faultyTxnPublisher is faultyPublisher on a transactional broker publisher: the relay finds the
// transactions through it.
type faultyTxnPublisher struct {
	*faultyPublisher
	txn forwarder.TransactionalPublisher
}

func (p *faultyTxnPublisher) Recover(ctx context.Context) ([]byte, error) { return p.txn.Recover(ctx) }
func (p *faultyTxnPublisher) Begin(ctx context.Context) error             { return p.txn.Begin(ctx) }
func (p *faultyTxnPublisher) Commit(ctx context.Context, progress []byte) error {
	return p.txn.Commit(ctx, progress)
}
func (p *faultyTxnPublisher) Abort(ctx context.Context) error { return p.txn.Abort(ctx) }

// errRelayCrash is the relay dying between publishing and marking (--crash-after-publish).
var errRelayCrash = errors.New("relay crashed after publishing, before marking (--crash-after-publish)")

// afterPublish runs between a pass's publishes and its mark. On every Nth pass the pass ends there
// as if the process had died: the broker has the messages, the rows stay unpublished and are
// published again by a later pass, and every inbox absorbs the duplicates. (Every Nth pass rather
// than every Nth message: a backlog longer than N would otherwise crash every pass.)
func (p *faultyPublisher) afterPublish() error {
	if n := p.passes.Add(1); n%p.crashEvery == 0 {
		fmt.Fprintf(os.Stderr, "demo: fault: relay pass %d ended after publishing, before marking (--crash-after-publish %d)\n", n, p.crashEvery)
		return errRelayCrash
	}
	return nil
}

// beforeConfirm runs in each flush of the log relay (--relay log, which has no passes) that has
// something to do, after publishing, before the published rows are removed and their position
// confirmed (the slot's on Postgres, the checkpoint's on MySQL). On every Nth the process exits
// there, as a crash would: the group's standby takes over and publishes again from the confirmed
// position. (Every Nth flush rather than every
// Nth message: after a takeover the backlog behind the confirmed position is published in a
// burst, and a process that died after N messages would die before its first flush every time
// once that backlog outgrew N, with no relay ever confirming anything.)
func (p *faultyPublisher) beforeConfirm() error {
	if n := p.passes.Add(1); n%p.crashEvery == 0 {
		fmt.Fprintf(os.Stderr, "demo: fault: log relay exits at its flush %d, after publishing, before confirming (--crash-after-publish %d)\n", n, p.crashEvery)
		os.Exit(3)
	}
	return nil
}
