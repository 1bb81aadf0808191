package integration

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// takeoverHeld is how many entries the killed consumer holds when it dies.
const takeoverHeld = 10

// Redis Streams: a consumer killed while it holds entries (read, never acknowledged) loses them to
// a live member of its group within seconds, not after ClaimAfter; they come as redeliveries.
func TestRedis_KilledConsumersEntriesAreTakenOverWithinSeconds(t *testing.T) {
	t.Parallel()
	url := testenv.RedisURL(t)
	topic := testenv.UniqueName(t, "takeover")
	dropWhenDone(t, "redis", url, []string{topic}, nil)
	b := openBackend(t, url, backends.Options{}) // ClaimAfter left at its 30s default
	publishEvents(t, b, topic, keys(takeoverHeld)...)

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRedisHolder$", "-test.v")
	cmd.Env = append(os.Environ(), "OUTBOXKIT_HELPER_REDIS_HOLDER="+url+"|"+topic)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 7 {
		t.Fatalf("the consumer process did not die holding the entries (%v):\n%s", err, out)
	}
	died := time.Now()

	got := subscribeAll(t, b, topic, "billing")
	uuids := map[string]bool{}
	testenv.Eventually(t, 20*time.Second, "the killed consumer's entries to be taken over", func() bool {
		for {
			select {
			case m := <-got:
				if redelivered, known := outboxkit.Redelivered(m.Context()); !known || !redelivered {
					t.Errorf("a taken-over entry was handed out as a first delivery (known %v)", known)
				}
				uuids[m.UUID] = true
				m.Ack()
				continue
			default:
			}
			return len(uuids) >= takeoverHeld
		}
	})
	took := time.Since(died)
	t.Logf("a killed consumer's %d pending entries taken over %s after it died (ClaimAfter 30s)", takeoverHeld, took.Round(10*time.Millisecond))
	if took > 10*time.Second {
		t.Errorf("takeover took %s, want a few seconds", took)
	}
}

// subscribeAll subscribes a consumer of group to topic until the test ends.
func subscribeAll(t *testing.T, b *backends.Backend, topic, group string) <-chan *message.Message {
	t.Helper()
	sub, err := b.NewSubscriber(group)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = sub.Close() })
	return msgs
}

// TestHelperRedisHolder is the killed consumer of TestRedis_KilledConsumers…: it takes every entry
// without acknowledging any, then exits with status 7.
func TestHelperRedisHolder(t *testing.T) {
	spec := os.Getenv("OUTBOXKIT_HELPER_REDIS_HOLDER")
	if spec == "" {
		return // only meaningful as the subprocess
	}
	url, topic, _ := strings.Cut(spec, "|")
	b := openBackend(t, url, backends.Options{Unacked: takeoverHeld})
	msgs := subscribeAll(t, b, topic, "billing")
	deadline := time.After(60 * time.Second)
	for n := 0; n < takeoverHeld; n++ {
		select {
		case <-msgs:
		case <-deadline:
			t.Fatalf("only %d entries arrived", n)
		}
	}
	os.Exit(7)
}

// Redis Streams: a consumer that is alive keeps what it holds, however long it takes, and another
// member of its group never gets it meanwhile.
func TestRedis_SlowConsumerIsNotRobbed(t *testing.T) {
	t.Parallel()
	url := testenv.RedisURL(t)
	topic := testenv.UniqueName(t, "slow")
	dropWhenDone(t, "redis", url, []string{topic}, nil)
	b := openBackend(t, url, backends.Options{ClaimAfter: time.Second, Unacked: takeoverHeld})
	publishEvents(t, b, topic, keys(takeoverHeld)...)

	slow := subscribeAll(t, b, topic, "billing")
	var held []*message.Message
	for len(held) < takeoverHeld {
		select {
		case m := <-slow:
			held = append(held, m)
		case <-time.After(30 * time.Second):
			t.Fatalf("only %d entries arrived", len(held))
		}
	}
	other := subscribeAll(t, b, topic, "billing")
	stolen := 0
	// Twice the time a gone consumer's entries take to move, and far past ClaimAfter.
	watch := time.After(2 * (3*time.Second + time.Second))
	for done := false; !done; {
		select {
		case m := <-other:
			stolen++
			m.Ack()
		case <-watch:
			done = true
		}
	}
	if stolen > 0 {
		t.Fatalf("another consumer got %d entries a live one holds", stolen)
	}
	for _, m := range held {
		m.Ack()
	}
}
