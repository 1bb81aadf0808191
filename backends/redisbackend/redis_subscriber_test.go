package redisbackend

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/backends/internal/brokerio"
	"github.com/outboxkit/outboxkit/internal/testenv"
)

// recovery bounds how long an entry left pending under a live consumer may take to be handed out.
const recovery = 15 * time.Second

// cuttingProxy forwards TCP connections to Redis and watches the bytes going one way for marker:
// at each occurrence for which cut says so, it drops the connection there instead of forwarding.
// Watching what goes to the client, the command has been done by Redis and its reply never
// arrives; watching what goes to Redis, the command never gets there. go-redis, seeing the
// connection end, sends the command again on a new one.
type cuttingProxy struct {
	ln       net.Listener
	target   string
	toClient bool
	marker   []byte
	cut      func() bool

	seen atomic.Int64 // occurrences of marker
	cuts atomic.Int64 // connections dropped at one
	mu   sync.Mutex
	open map[net.Conn]bool
	wg   sync.WaitGroup
}

func newCuttingProxy(t *testing.T, target string, toClient bool, marker string, cut func() bool) *cuttingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cuttingProxy{ln: ln, target: target, toClient: toClient, marker: []byte(marker), cut: cut, open: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *cuttingProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.open {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *cuttingProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.open[client], p.open[server] = true, true
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(client, server, p.toClient) // what Redis sends
		go p.pipe(server, client, !p.toClient)
	}
}

// pipe copies src to dst; when watch, it looks for marker across chunk boundaries too.
func (p *cuttingProxy) pipe(dst, src net.Conn, watch bool) {
	defer p.wg.Done()
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		p.mu.Lock()
		delete(p.open, dst)
		delete(p.open, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32*1024)
	var tail []byte // the last bytes of what came before, for a marker split between two reads
	for {
		n, err := src.Read(buf)
		if n > 0 && watch {
			window := append(tail, buf[:n]...)
			for i := 0; ; {
				j := bytes.Index(window[i:], p.marker)
				if j < 0 {
					break
				}
				i += j + 1
				if i-1+len(p.marker) <= len(tail) {
					continue // counted with the chunk before
				}
				p.seen.Add(1)
				if p.cut() {
					p.cuts.Add(1)
					return
				}
			}
			keep := min(len(window), len(p.marker)-1)
			tail = append([]byte(nil), window[len(window)-keep:]...)
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// cutTimes is a cut that says yes n times, then no.
func cutTimes(n int64) func() bool {
	var left atomic.Int64
	left.Store(n)
	return func() bool { return left.Add(-1) >= 0 }
}

// testLogger logs to the test and remembers the error messages.
type testLogger struct {
	watermill.LoggerAdapter
	mu     sync.Mutex
	errors []string
}

func newTestLogger(t *testing.T) *testLogger {
	return &testLogger{LoggerAdapter: watermill.NewStdLoggerWithOut(testWriter{t}, true, false)}
}

func (l *testLogger) Error(msg string, err error, fields watermill.LogFields) {
	l.mu.Lock()
	l.errors = append(l.errors, msg)
	l.mu.Unlock()
	l.LoggerAdapter.Error(msg, err, fields)
}

func (l *testLogger) logged(prefix string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.errors {
		if strings.HasPrefix(m, prefix) {
			return true
		}
	}
	return false
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// redisFixture is a stream and a group of the test's own on the test server, a client straight
// to it, and a subscriber whose clients go through addr (a proxy).
type redisFixture struct {
	direct     *redis.Client
	topic      string
	group      string
	marshaller redisMarshaller
}

func newRedisFixture(t *testing.T) *redisFixture {
	t.Helper()
	url := testenv.RedisURL(t)
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	f := &redisFixture{direct: redis.NewClient(opts), topic: testenv.UniqueName(t, "pending"), group: testenv.UniqueName(t, "g"),
		marshaller: redisMarshaller{wire: brokerio.NewWire(backends.Options{})}}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		f.direct.Del(ctx, f.topic)
		if keys, err := f.direct.Keys(ctx, aliveKey(f.group, "*")).Result(); err == nil && len(keys) > 0 {
			f.direct.Del(ctx, keys...)
		}
		_ = f.direct.Close()
	})
	return f
}

func (f *redisFixture) addr() string {
	return f.direct.Options().Addr
}

// subscriber is the group's subscriber, its clients going to addr; it is closed when the test ends
// unless the test closes it first.
func (f *redisFixture) subscriber(t *testing.T, addr string, unacked int, logger watermill.LoggerAdapter) *redisSubscriber {
	t.Helper()
	opts := *f.direct.Options()
	opts.Addr = addr
	boundPool(&opts, "redis://"+addr+"/0")
	s := newRedisSubscriber(func() *redis.Client { o := opts; return redis.NewClient(&o) }, f.group, unacked, 30*time.Second, f.marshaller, logger)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// publish adds an entry whose payload is payload, straight to Redis.
func (f *redisFixture) publish(t *testing.T, uuid, payload string) string {
	t.Helper()
	values, err := f.marshaller.Marshal(f.topic, message.NewMessage(uuid, []byte(payload)))
	if err != nil {
		t.Fatal(err)
	}
	id, err := f.direct.XAdd(context.Background(), &redis.XAddArgs{Stream: f.topic, Values: values}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// pending is how many entries of the group are pending.
func (f *redisFixture) pending(t *testing.T) int64 {
	t.Helper()
	p, err := f.direct.XPending(context.Background(), f.topic, f.group).Result()
	if err != nil {
		t.Fatal(err)
	}
	return p.Count
}

// receive waits for a message on msgs for up to within; when none comes, it says what is pending.
func (f *redisFixture) receive(t *testing.T, msgs <-chan *message.Message, within time.Duration, what string) *message.Message {
	t.Helper()
	select {
	case m, ok := <-msgs:
		if !ok {
			t.Fatalf("the subscription ended while waiting for %s", what)
		}
		return m
	case <-time.After(within):
		t.Fatalf("timed out after %s waiting for %s; pending: %s", within, what, f.pendingReport())
		return nil
	}
}

// pendingReport lists the group's pending entries: id, consumer, idle time, deliveries, and
// whether the consumer's liveness key is there.
func (f *redisFixture) pendingReport() string {
	ctx := context.Background()
	p, err := f.direct.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: f.topic, Group: f.group, Start: "-", End: "+", Count: 10}).Result()
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range p {
		alive, _ := f.direct.Exists(ctx, aliveKey(f.group, e.Consumer)).Result()
		fmt.Fprintf(&b, "[%s under %s (alive %v), idle %s, delivered %d] ", e.ID, e.Consumer, alive > 0, e.Idle, e.RetryCount)
	}
	if len(p) == 0 {
		return "none"
	}
	return b.String()
}

// closeAndCheck closes the subscriber and fails the test if any goroutine that was not there
// before outlives it (the proxy's end with the test).
func closeAndCheck(t *testing.T, s *redisSubscriber, before goleak.Option) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	proxy := goleak.IgnoreAnyFunction("github.com/outboxkit/outboxkit/backends/redisbackend.(*cuttingProxy).accept")
	pipes := goleak.IgnoreAnyFunction("github.com/outboxkit/outboxkit/backends/redisbackend.(*cuttingProxy).pipe")
	if err := goleak.Find(before, proxy, pipes); err != nil {
		t.Fatalf("goroutines outlived Close: %v", err)
	}
}

// Redis counts an entry delivered when it sends the XREADGROUP reply: with the connection cut
// before the reply reaches the client, go-redis reads again on a new connection, finds nothing
// new, and reports no error. The entry is pending under a consumer that is alive, which nobody
// claims from; the subscription itself must hand it out.
func TestRedisSubscription_EntryInALostReadReplyIsHandedOut(t *testing.T) {
	before := goleak.IgnoreCurrent()
	f := newRedisFixture(t)
	marker := fmt.Sprintf("lost-read-%d", time.Now().UnixNano())
	proxy := newCuttingProxy(t, f.addr(), true, marker, cutTimes(1))
	s := f.subscriber(t, proxy.ln.Addr().String(), 4, newTestLogger(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := s.Subscribe(ctx, f.topic)
	if err != nil {
		t.Fatal(err)
	}
	f.publish(t, "uuid-lost-read", marker)
	testenv.Eventually(t, recovery, "the read reply holding the entry to be cut", func() bool { return proxy.cuts.Load() == 1 })
	cutAt := time.Now()

	m := f.receive(t, msgs, recovery, "the entry whose read reply was lost")
	took := time.Since(cutAt)
	if m.UUID != "uuid-lost-read" {
		t.Fatalf("got %q, want the entry whose reply was lost", m.UUID)
	}
	if redelivered, known := outboxkit.Redelivered(m.Context()); !known || !redelivered {
		t.Errorf("handed out as a first delivery (known %v); Redis counted it delivered", known)
	}
	m.Ack()
	t.Logf("an entry of a lost read reply handed out %s after the cut", took.Round(time.Millisecond))
	testenv.Eventually(t, recovery, "the entry to be acknowledged", func() bool { return f.pending(t) == 0 })
	cancel()
	closeAndCheck(t, s, before)
}

// An XCLAIM whose reply is lost leaves the claimed entries under the claimer: go-redis claims again
// on a new connection, and as the first claim made them idle no longer, gets nothing and no error.
func TestRedisSubscription_EntryInALostClaimReplyIsHandedOut(t *testing.T) {
	before := goleak.IgnoreCurrent()
	f := newRedisFixture(t)
	marker := fmt.Sprintf("lost-claim-%d", time.Now().UnixNano())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A consumer that heartbeats and is gone (no liveness key) holds the entry.
	if err := f.direct.XGroupCreateMkStream(ctx, f.topic, f.group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	f.publish(t, "uuid-lost-claim", marker)
	gone := f.group + "-dead" + heartbeatSuffix
	if err := f.direct.XReadGroup(ctx, &redis.XReadGroupArgs{Group: f.group, Consumer: gone, Streams: []string{f.topic, ">"},
		Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	proxy := newCuttingProxy(t, f.addr(), true, marker, cutTimes(1))
	s := f.subscriber(t, proxy.ln.Addr().String(), 4, newTestLogger(t))
	msgs, err := s.Subscribe(ctx, f.topic)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, recovery, "the claim reply holding the entry to be cut", func() bool { return proxy.cuts.Load() == 1 })
	cutAt := time.Now()

	m := f.receive(t, msgs, recovery, "the entry whose claim reply was lost")
	took := time.Since(cutAt)
	if m.UUID != "uuid-lost-claim" {
		t.Fatalf("got %q, want the entry whose claim reply was lost", m.UUID)
	}
	m.Ack()
	t.Logf("an entry of a lost claim reply handed out %s after the cut", took.Round(time.Millisecond))
	testenv.Eventually(t, recovery, "the entry to be acknowledged", func() bool { return f.pending(t) == 0 })
	cancel()
	closeAndCheck(t, s, before)
}

// An acknowledgement that Redis never gets, however many times it is sent, leaves the entry
// pending under the live consumer: it must be handed out again (a duplicate the inbox absorbs),
// not left there.
func TestRedisSubscription_EntryWhoseAckIsGivenUpIsHandedOutAgain(t *testing.T) {
	before := goleak.IgnoreCurrent()
	f := newRedisFixture(t)
	logger := newTestLogger(t)
	var dropAcks atomic.Bool
	dropAcks.Store(true)
	proxy := newCuttingProxy(t, f.addr(), false, "xack", dropAcks.Load) // go-redis writes commands in lower case
	s := f.subscriber(t, proxy.ln.Addr().String(), 4, logger)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := s.Subscribe(ctx, f.topic)
	if err != nil {
		t.Fatal(err)
	}
	f.publish(t, "uuid-lost-ack", "lost-ack")
	m := f.receive(t, msgs, recovery, "the entry")
	m.Ack()
	testenv.Eventually(t, 2*recovery, "the subscription to give up acknowledging", func() bool {
		return logger.logged("Cannot acknowledge Redis stream entries")
	})
	dropAcks.Store(false)
	gaveUp := time.Now()

	again := f.receive(t, msgs, recovery, "the entry whose acknowledgement was given up")
	took := time.Since(gaveUp)
	if again.UUID != "uuid-lost-ack" {
		t.Fatalf("got %q, want the entry whose acknowledgement was lost", again.UUID)
	}
	again.Ack()
	t.Logf("an entry whose ack was given up (%d XACKs dropped) handed out again %s later", proxy.cuts.Load(), took.Round(time.Millisecond))
	testenv.Eventually(t, recovery, "the entry to be acknowledged", func() bool { return f.pending(t) == 0 })
	cancel()
	closeAndCheck(t, s, before)
}

// What a subscription holds, however long, it does not hand out again: only entries it does not
// hold are taken back from its own pending list.
func TestRedisSubscription_EntriesHeldAreNotHandedOutAgain(t *testing.T) {
	before := goleak.IgnoreCurrent()
	f := newRedisFixture(t)
	// Counts the subscription's rounds of claims: each begins with XINFO CONSUMERS.
	proxy := newCuttingProxy(t, f.addr(), false, "xinfo", func() bool { return false })
	s := f.subscriber(t, proxy.ln.Addr().String(), 4, newTestLogger(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := s.Subscribe(ctx, f.topic)
	if err != nil {
		t.Fatal(err)
	}
	f.publish(t, "uuid-held", "held")
	held := f.receive(t, msgs, recovery, "the entry")
	// The entry is held for several rounds past the idle time after which an entry not held is
	// taken back.
	rounds := proxy.seen.Load()
	idleAt := time.Now().Add(redisOwnIdle)
	testenv.Eventually(t, recovery, "rounds of claims past the entry's idle bound", func() bool {
		if time.Now().Before(idleAt) {
			rounds = proxy.seen.Load()
		}
		return proxy.seen.Load() >= rounds+3
	})
	select {
	case m := <-msgs:
		t.Fatalf("entry %s handed out again while held", m.UUID)
	default:
	}
	held.Ack()
	testenv.Eventually(t, recovery, "the entry to be acknowledged", func() bool { return f.pending(t) == 0 })
	cancel()
	closeAndCheck(t, s, before)
}
