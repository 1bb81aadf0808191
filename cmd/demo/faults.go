package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
)

// faultyPublisher provokes the forwarder's failure modes on purpose.
type faultyPublisher struct {
	message.Publisher
	failEvery  int64 // --fail-publish-every: every Nth publish is refused (a message failure)
	crashEvery int64 // --crash-after-publish: every Nth pass that publishes dies before marking
	// exitAfter is --crash-after-publish with --relay log, which has no passes: the process exits
	// right after the Nth message it published, before the relay confirms it.
	exitAfter int64
	published atomic.Int64
	calls     atomic.Int64
	passes    atomic.Int64
}

func (p *faultyPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.failEvery > 0 && p.calls.Add(1)%p.failEvery == 0 {
		return fmt.Errorf("refused by --fail-publish-every %d", p.failEvery)
	}
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	if p.exitAfter > 0 {
		if n := p.published.Add(int64(len(msgs))); n >= p.exitAfter {
			fmt.Fprintf(os.Stderr, "demo: fault: log relay exits after publishing %d messages, before confirming them (--crash-after-publish %d)\n",
				n, p.exitAfter)
			os.Exit(3)
		}
	}
	return nil
}

// Check is the broker publisher's own, so that the relay watches the broker through this wrapper
// (forwarder.Config.CircuitWatch).
func (p *faultyPublisher) Check(ctx context.Context) error {
	if c, ok := p.Publisher.(interface{ Check(context.Context) error }); ok {
		return c.Check(ctx)
	}
	return nil
}

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
