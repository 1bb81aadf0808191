package integration

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/storetest"
)

// Every backend this machine can interrupt loses its connections (the relay's and the consumer's)
// for a while mid-stream: nothing is lost, nothing is applied twice, and the pipeline resumes by
// itself once the broker answers again - no restart, no operator.
func TestDisconnect_EveryBackendResumesByItself(t *testing.T) {
	cases := []struct {
		name, scheme string
		opts         backends.Options
		consumer     []effectConsumerOpt
	}{
		{"amqp", "amqp", backends.Options{}, nil},
		// A batch consumer loses its connection with a batch in hand: the batch's acks are lost, the
		// broker delivers it again, the inbox absorbs what had committed.
		{"amqp batched", "amqp", backends.Options{Unacked: 50}, []effectConsumerOpt{withBatch(50)}},
		{"nats", "nats", backends.Options{AckWait: 2 * time.Second}, nil},
		{"redis", "redis", backends.Options{ClaimAfter: 2 * time.Second}, nil},
		{"kafka", "kafka", backends.Options{}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			proxy, url := brokerBehindProxy(t, c.scheme)
			runDisconnect(t, c.scheme, proxy, url, c.opts, c.consumer...)
		})
	}
}

func runDisconnect(t *testing.T, scheme string, proxy *testenv.Proxy, url string, opts backends.Options, consumer ...effectConsumerOpt) {
	const perPhase, nKeys = 200, 10
	pg := testenv.NewPG(t)
	createEffects(t, pgDB(pg))
	b := openBackend(t, url, opts)
	topic := testenv.UniqueName(t, "disc") + ".placed"
	dropWhenDone(t, scheme, url, []string{topic}, []string{"app"})
	if scheme == "amqp" {
		testenv.DeclareQueue(t, testenv.AMQPURL(t), topic, "app")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	startEffectConsumer(t, ctx, pgDB(pg), b, topic, "app", consumer...)
	relay := newRelay(t, pgDB(pg), b.Publisher, func(c *forwarder.Config) {
		c.PublishTimeout = 2 * time.Second // a publish into the cut connection gives up soon
	})
	storetest.RunForwarder(t, relay)

	writeEvents(t, pgDB(pg), topic, keys(nKeys), perPhase/nKeys)
	testenv.Eventually(t, 60*time.Second, "the first events to be applied", func() bool { return countEffects(t, pgDB(pg), "app") >= perPhase/2 })

	proxy.Cut()
	writeEvents(t, pgDB(pg), topic, keys(nKeys), perPhase/nKeys) // written during the outage
	testenv.Eventually(t, 60*time.Second, "the relay to notice the outage", func() bool { return relay.Health().CircuitOpen })
	proxy.Restore()

	dead := func() int {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE dead_lettered_at IS NOT NULL`)
	}
	testenv.Eventually(t, 60*time.Second, "every event to be applied after the outage", func() bool {
		return countEffects(t, pgDB(pg), "app") >= 2*perPhase || dead() > 0
	})
	if n := dead(); n > 0 {
		t.Fatalf("%d rows were dead-lettered during the outage: an unreachable broker must open the circuit, not fail messages", n)
	}
	testenv.Eventually(t, 30*time.Second, "the outbox to be drained", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL`) == 0
	})
	if n := countEffects(t, pgDB(pg), "app"); n != 2*perPhase {
		t.Errorf("%d effects applied, want exactly %d", n, 2*perPhase)
	}
}

// kafkaBehindProxy starts a kfake broker of the test's own that tells its clients to dial a proxy
// in front of it: Kafka clients connect to the address the broker advertises, so a proxy in front
// of the shared broker would only cut the first connection.
// brokerBehindProxy is the shared broker of scheme (amqp, nats, redis, kafka) behind a proxy of the
// test's own, and the URL that reaches it through the proxy.
func brokerBehindProxy(t *testing.T, scheme string) (*testenv.Proxy, string) {
	t.Helper()
	switch scheme {
	case "amqp":
		return testenv.ProxyURL(t, testenv.AMQPURL(t))
	case "nats":
		return testenv.ProxyURL(t, testenv.NATSURL(t))
	case "redis":
		return testenv.ProxyURL(t, testenv.RedisURL(t))
	case "kafka":
		return kafkaBehindProxy(t)
	}
	t.Fatalf("no proxy for %s", scheme)
	return nil, ""
}

func kafkaBehindProxy(t *testing.T) (*testenv.Proxy, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := ln.Addr().String()
	_ = ln.Close()
	proxy := testenv.NewProxy(t, listen)

	bin := filepath.Join(t.TempDir(), "kfake")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = filepath.Join("..", "tools", "kfake")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build tools/kfake: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-addr", proxy.Addr(), "-listen", listen)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	testenv.Eventually(t, 30*time.Second, "kfake to listen on "+listen, func() bool {
		c, err := net.DialTimeout("tcp", listen, time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})
	return proxy, "kafka://" + strings.TrimPrefix(proxy.Addr(), "tcp://")
}

// A Kafka group member that lost its session in a long outage rejoins within about a second of the
// broker coming back, however long the broker was away: its client's retries do not grow past a
// second (franz-go's own grow to 5 s, and a member came back up to 5 s after the broker did).
func TestKafka_MemberRejoinsSoonAfterALongOutage(t *testing.T) {
	t.Parallel()
	proxy, _, _, _, count := kafkaMemberBehindProxy(t, "rejoin")
	testenv.Eventually(t, 30*time.Second, "the member to be assigned its partition", func() bool { return count("Kafka partitions assigned") >= 1 })
	proxy.Cut()
	testenv.Eventually(t, 30*time.Second, "the member to lose its partition", func() bool { return count("Kafka partitions revoked") >= 1 })
	// The outage is held 12 s: long enough for franz-go's own backoff to reach 4–5 s (250 ms
	// doubling). It ends just after the group's own attempt to join failed, as franz-go logs it, so
	// that its next attempt is a whole backoff away.
	<-time.After(12 * time.Second)
	const failed = "Kafka client: group manage loop errored"
	n := count(failed)
	testenv.Eventually(t, 10*time.Second, "the member to fail to join its group again", func() bool { return count(failed) > n })
	proxy.Restore()
	restored := time.Now()
	testenv.Eventually(t, 30*time.Second, "the member to rejoin its group", func() bool { return count("Kafka partitions assigned") >= 2 })
	took := time.Since(restored)
	t.Logf("rejoined %s after the broker came back (12 s outage)", took.Round(10*time.Millisecond))
	if took > 3*time.Second {
		t.Fatalf("the member rejoined %s after the broker came back, want within about a second (at most 3 s here)", took.Round(10*time.Millisecond))
	}
}

// A broker that drops a member's connections for a moment — here it accepts them and closes them
// at once, as a load balancer in front of a restarting broker does — does not cost the member its
// group session: it goes on heartbeating once the broker answers, keeps its partitions and
// consumes on, without a rebalance and without reading again what it had not committed.
func TestKafka_MemberKeepsItsPartitionsThroughAShortCut(t *testing.T) {
	t.Parallel()
	proxy, b, topic, msgs, count := kafkaMemberBehindProxy(t, "blip")
	testenv.Eventually(t, 30*time.Second, "the member to be assigned its partition", func() bool { return count("Kafka partitions assigned") >= 1 })
	receive := func(uuid string) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case m := <-msgs:
				m.Ack()
				if m.UUID == uuid {
					return
				}
			case <-deadline:
				t.Fatalf("message %s not received", uuid)
			}
		}
	}
	first := pipeline.NewEvent("Happened", "k", []byte(`{}`))
	if err := b.Publisher.Publish(topic, first); err != nil {
		t.Fatal(err)
	}
	receive(first.UUID)
	// Held past the heartbeat interval (2 s), well within the session timeout (6 s): the member's
	// heartbeat meets the cut.
	n := proxy.Attempts()
	proxy.Cut()
	<-time.After(3 * time.Second)
	proxy.Restore()
	if proxy.Attempts() == n {
		t.Fatal("the member did not try the broker during the cut: the test proves nothing")
	}
	second := pipeline.NewEvent("Happened", "k", []byte(`{}`))
	if err := b.Publisher.Publish(topic, second); err != nil {
		t.Fatal(err)
	}
	receive(second.UUID)
	if lost, assigned := count("Kafka partitions revoked"), count("Kafka partitions assigned"); lost > 0 || assigned != 1 {
		t.Fatalf("after a 3 s cut the member's partition was revoked %d times and assigned %d times, want kept throughout", lost, assigned)
	}
}

// kafkaMemberBehindProxy subscribes a member of group "app" to a new one-partition topic of a
// broker of its own behind a proxy, and returns the proxy, the backend, the topic, the member's
// messages, and count, which counts the lines of msg the backend has logged at any level.
func kafkaMemberBehindProxy(t *testing.T, name string) (proxy *testenv.Proxy, b *backends.Backend, topic string,
	msgs <-chan *message.Message, count func(msg string) int) {
	t.Helper()
	proxy, url := kafkaBehindProxy(t)
	topic = testenv.UniqueName(t, name) + ".placed"
	createKafkaTopic(t, url, topic, 1)
	logs := watermill.NewCaptureLogger()
	b = openBackend(t, url, backends.Options{Logger: logs})
	sub, err := b.NewSubscriber("app")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if msgs, err = sub.Subscribe(ctx, topic); err != nil {
		t.Fatal(err)
	}
	count = func(msg string) int {
		n := 0
		for _, level := range logs.Captured() {
			for _, m := range level {
				if m.Msg == msg {
					n++
				}
			}
		}
		return n
	}
	return proxy, b, topic, msgs, count
}
