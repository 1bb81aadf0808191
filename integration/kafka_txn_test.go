package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/faults"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/prom"
	"github.com/outboxkit/outboxkit/store/storetest"
)

// The transactional relay's proof: relay processes killed with SIGKILL at random points — before
// publishing, with a transaction open after publishing, after the commit before the mark, and at
// a random instant (in its start and recovery too) — and still a consumer that reads only
// committed records, with no inbox, sees every event exactly once and each key in order: no
// duplicate, no gap, no inversion; so does kcat (librdkafka) with isolation.level=read_committed.
// The control — the same kills without a transactional_id — shows the duplicates the
// transactions remove.
//
// OUTBOXKIT_KAFKA_TXN_EVENTS and OUTBOXKIT_KAFKA_TXN_KILLS scale it (make chaos-kafka-txn runs
// 100,000 events and 1,000 kills).
func TestKafkaTxn_RelayKilledAtRandomPointsExactlyOnce(t *testing.T) {
	t.Parallel()
	events := envInt(t, "OUTBOXKIT_KAFKA_TXN_EVENTS", 6000)
	kills := envInt(t, "OUTBOXKIT_KAFKA_TXN_KILLS", 60)
	url := testenv.KafkaURL(t)
	const nKeys = 60
	events -= events % nKeys // each key the same number of events

	t.Run("transactional", func(t *testing.T) {
		t.Parallel()
		pg := testenv.NewPG(t)
		topic := testenv.UniqueName(t, "eos") + ".placed"
		createKafkaTopic(t, url, topic, 4)
		writeEvents(t, pgDB(pg), topic, keys(nKeys), events/nKeys)
		txnURL := withQuery(url, "transactional_id="+testenv.UniqueName(t, "relay"))
		st := killRelayLoop(t, pg, txnURL, topic, kills)
		t.Logf("%d events, %d relay processes killed (%v), %d transactions recovered", events, st.kills, st.byPoint, st.recovered)
		if st.byPoint["after_commit"] > 0 && st.recovered == 0 {
			t.Fatalf("%d relays died after their commit, before the mark, and no successor recorded what they committed", st.byPoint["after_commit"])
		}

		recs := readCommitted(t, url, topic, events)
		if d := checkExactlyOnce(recs, nKeys, events/nKeys); d.err != nil {
			t.Fatalf("read_committed (franz-go): %v", d.err)
		}
		lines := kcatReadCommitted(t, url, topic, events)
		if d := checkExactlyOnce(lines, nKeys, events/nKeys); d.err != nil {
			t.Fatalf("read_committed (kcat): %v", d.err)
		}
	})

	t.Run("control without transactions", func(t *testing.T) {
		t.Parallel()
		pg := testenv.NewPG(t)
		topic := testenv.UniqueName(t, "control") + ".placed"
		createKafkaTopic(t, url, topic, 4)
		n := min(events, 3000)
		writeEvents(t, pgDB(pg), topic, keys(nKeys), n/nKeys)
		st := killRelayLoop(t, pg, url, topic, min(kills, 20), "after_publish")
		recs := readCommitted(t, url, topic, n)
		d := checkExactlyOnce(recs, nKeys, n/nKeys)
		t.Logf("without transactions: %d events, %d kills after publishing: %d duplicates", n, st.kills, d.duplicates)
		if d.duplicates == 0 {
			t.Fatalf("%d kills after publishing, before the mark, and no duplicate: the control does not provoke what the transactions remove", st.kills)
		}
		if d.missing > 0 {
			t.Fatalf("without transactions %d events are missing: %v", d.missing, d.err)
		}
	})
}

// A zombie — a relay that stalls with its transaction open while its successor starts — never
// commits after the successor started: the successor's start fences it, its commit fails with an
// error marked outboxkit.Fenced, and none of what it published becomes visible.
func TestKafkaTxn_ZombieIsFencedBySuccessor(t *testing.T) {
	t.Parallel()
	url := testenv.KafkaURL(t)
	pg := testenv.NewPG(t)
	db := pgDB(pg)
	topic := testenv.UniqueName(t, "zombie") + ".placed"
	createKafkaTopic(t, url, topic, 2)
	const nKeys, perKey = 10, 20
	writeEvents(t, db, topic, keys(nKeys), perKey)
	txnURL := withQuery(url, "transactional_id="+testenv.UniqueName(t, "relay"))

	zombie := newRelay(t, db, openBackend(t, txnURL, kafkaOpts).Publisher, func(c *forwarder.Config) { c.BatchSize = 50 })
	stalled, resume := make(chan struct{}), make(chan struct{})
	var once atomic.Bool
	faults.Inject(zombie, faults.AfterPublish, func() error {
		if once.CompareAndSwap(false, true) {
			close(stalled)
			<-resume
		}
		return nil
	})
	zombieErr := make(chan error, 1)
	go func() {
		_, err := zombie.DispatchBatch(context.Background())
		zombieErr <- err
	}()
	<-stalled // the zombie published 50 rows in its open transaction and stalls before committing

	successor := newRelay(t, db, openBackend(t, txnURL, kafkaOpts).Publisher, func(c *forwarder.Config) { c.BatchSize = 50 })
	storetest.RunForwarder(t, successor)
	// The successor's first pass fences the zombie. The zombie's claim holds the first rows of
	// every key (on Postgres, row locks), so the successor has nothing to publish until it ends.
	testenv.Eventually(t, 30*time.Second, "the successor's first pass", func() bool {
		return !successor.Health().LastPass.IsZero()
	})
	close(resume)
	err := <-zombieErr
	if !outboxkit.IsFenced(err) {
		t.Fatalf("the zombie's pass returned %v, want an error marked outboxkit.Fenced", err)
	}
	t.Logf("the zombie: %v", err)
	testenv.Eventually(t, 30*time.Second, "the successor to publish every row", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL`) == 0
	})
	recs := readCommitted(t, url, topic, nKeys*perKey)
	if d := checkExactlyOnce(recs, nKeys, perKey); d.err != nil {
		t.Fatalf("read_committed after a zombie: %v", d.err)
	}
	// And the zombie, fenced, stays so: its next pass fails at once, publishing nothing.
	if _, err := zombie.DispatchBatch(context.Background()); !outboxkit.IsFenced(err) {
		t.Fatalf("the fenced zombie's next pass returned %v, want fenced", err)
	}
}

// killStats is what killRelayLoop did.
type killStats struct {
	kills     int
	byPoint   map[string]int
	recovered int
}

// killPoints are where a relay process dies: the relay's points, and "timer", a random instant
// from its start (its recovery included).
var killPoints = []string{"before_publish", "after_publish", "after_commit", "timer"}

// killRelayLoop runs relay processes on pg's outbox one after another, each killed with SIGKILL
// at a random point (of points, or any), until kills processes died or the outbox is drained,
// then one more that drains it.
func killRelayLoop(t *testing.T, pg *testenv.PG, kafkaURL, topic string, kills int, points ...string) killStats {
	t.Helper()
	if len(points) == 0 {
		points = killPoints
	}
	st := killStats{byPoint: map[string]int{}}
	deadline := time.Now().Add(20 * time.Minute)
	for st.kills < kills {
		if time.Now().After(deadline) {
			t.Fatalf("%d relay processes in 20 minutes, %d killed", st.kills, kills)
		}
		point := points[rand.IntN(len(points))]
		at := 1 + rand.IntN(2) // the pass it dies in, or for the timer, milliseconds/100
		code, out := runTxnRelay(t, pg, kafkaURL, point, at)
		switch code {
		case -1: // killed
			st.kills++
			st.byPoint[point]++
		case 0: // drained before its point came
		default:
			t.Fatalf("relay process exited with %d:\n%s", code, out)
		}
		st.recovered += strings.Count(out, "group's last transaction committed")
		if code == 0 {
			break
		}
	}
	if code, out := runTxnRelay(t, pg, kafkaURL, "none", 0); code != 0 {
		t.Fatalf("the last relay process exited with %d:\n%s", code, out)
	} else {
		st.recovered += strings.Count(out, "group's last transaction committed")
	}
	if n := pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL`); n != 0 {
		t.Fatalf("%d rows left unpublished", n)
	}
	return st
}

// runTxnRelay runs one relay process (TestHelperKafkaTxnRelay) and returns its exit code, -1 when
// it was killed, and its output.
func runTxnRelay(t *testing.T, pg *testenv.PG, kafkaURL, point string, at int) (int, string) {
	t.Helper()
	return runKilledHelper(t, "TestHelperKafkaTxnRelay", "OUTBOXKIT_HELPER_KAFKA_TXN",
		pg.URL, string(pg.Schema), kafkaURL, point, strconv.Itoa(at))
}

// runKilledHelper runs the test helper process named test with its spec — fields joined by |, in
// variable env — and returns its exit code, -1 when SIGKILL ended it, and its output.
func runKilledHelper(t *testing.T, test, env string, fields ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v")
	cmd.Env = append(os.Environ(), env+"="+strings.Join(fields, "|"))
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &exit):
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return -1, string(out)
		}
		return exit.ExitCode(), string(out)
	}
	t.Fatalf("%s process: %v", test, err)
	return 0, ""
}

// TestHelperKafkaTxnRelay is the relay process of the transactional proof: a forwarder on the
// outbox that kills its own process with SIGKILL at its point, in its at-th pass (for "timer", at
// a random instant up to at×100 ms from its start), or, with point "none", exits once the outbox
// is drained.
func TestHelperKafkaTxnRelay(t *testing.T) {
	spec := os.Getenv("OUTBOXKIT_HELPER_KAFKA_TXN")
	if spec == "" {
		return // only meaningful as the subprocess
	}
	p := strings.Split(spec, "|")
	at, _ := strconv.Atoi(p[4])
	pg := testenv.AttachPG(t, p[0], p[1])
	b := openBackend(t, p[2], kafkaOpts)
	relay := newRelay(t, pgDB(pg), b.Publisher, func(c *forwarder.Config) {
		c.BatchSize, c.MaxInFlight = 50, 8
		c.Logger = watermill.NewStdLogger(false, false) // its parent counts the recoveries it logs
	})
	die := func() error {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
	var passes atomic.Int64
	at64 := int64(at)
	switch p[3] {
	case "before_publish":
		faults.Inject(relay, faults.BeforePublish, func() error {
			if passes.Add(1) == at64 {
				return die()
			}
			return nil
		})
	case "after_publish":
		faults.Inject(relay, faults.AfterPublish, func() error {
			if passes.Add(1) == at64 {
				return die()
			}
			return nil
		})
	case "after_commit":
		faults.Inject(relay, faults.AfterCommit, func() error {
			if passes.Add(1) == at64 {
				return die()
			}
			return nil
		})
	case "timer":
		time.AfterFunc(time.Duration(rand.IntN(at*100+1))*time.Millisecond, func() { _ = die() })
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	testenv.Eventually(t, 5*time.Minute, "the outbox to be drained", func() bool {
		return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL`) == 0
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// txnRecord is one event as a consumer without an inbox read it: its key and its number.
type txnRecord struct {
	key string
	n   int
	id  string
}

// readCommitted reads topic from its start with a franz-go consumer at read_committed, up to its
// committed end, and wants at least want records. It keeps the transactions' markers only to know
// where a partition ends: the records it returns are the data a consumer is handed.
func readCommitted(t *testing.T, url, topic string, want int) []txnRecord {
	t.Helper()
	broker := strings.TrimPrefix(url, "kafka://")
	adm, err := kgo.NewClient(kgo.SeedBrokers(broker))
	if err != nil {
		t.Fatal(err)
	}
	ends, err := kadm.NewClient(adm).ListCommittedOffsets(context.Background(), topic)
	adm.Close()
	if err != nil {
		t.Fatal(err)
	}
	left := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			left[o.Partition] = o.Offset
		}
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords()) // the end of a partition is a transaction's marker: seen, it says the partition is read
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out []txnRecord
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d records of %s, partitions %v not read to their end", len(out), topic, left)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if !r.Attrs.IsControl() {
				out = append(out, decodeTxnRecord(t, string(r.Key), r.Value, headerOf(r, "_watermill_message_uuid")))
			}
			if end, ok := left[r.Partition]; ok && r.Offset+1 >= end {
				delete(left, r.Partition)
			}
		})
	}
	if len(out) < want {
		t.Fatalf("read_committed read %d records of %s, want at least %d", len(out), topic, want)
	}
	return out
}

func headerOf(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func decodeTxnRecord(t *testing.T, key string, value []byte, id string) txnRecord {
	t.Helper()
	var v struct {
		Key string `json:"key"`
		N   int    `json:"n"`
	}
	if err := json.Unmarshal(value, &v); err != nil {
		t.Fatalf("record %q: %v", value, err)
	}
	if v.Key != key {
		t.Fatalf("record of key %q carries key %q", key, v.Key)
	}
	return txnRecord{key: key, n: v.N, id: id}
}

// kcatReadCommitted reads topic from its start with kcat at isolation.level=read_committed until
// the end of each partition.
func kcatReadCommitted(t *testing.T, url, topic string, want int) []txnRecord {
	t.Helper()
	kcat := testenv.Kcat(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kcat, "-C", "-b", strings.TrimPrefix(url, "kafka://"), "-t", topic, "-o", "beginning", "-e", "-q",
		"-X", "isolation.level=read_committed", "-f", "%k\t%s\n")
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("kcat -C: %v", err)
	}
	var out []txnRecord
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		key, value, ok := strings.Cut(line, "\t")
		if !ok {
			t.Fatalf("kcat printed %q", line)
		}
		out = append(out, decodeTxnRecord(t, key, []byte(value), ""))
	}
	if len(out) < want {
		t.Fatalf("kcat read %d records of %s, want at least %d", len(out), topic, want)
	}
	return out
}

// txnVerdict is what a consumer without an inbox saw.
type txnVerdict struct {
	duplicates, missing, inversions int
	err                             error // the first fault, nil when each event came once in its key's order
}

// checkExactlyOnce checks that each of nKeys keys' events 0..perKey-1 came exactly once, in
// order, reading them as a consumer of each key's partition does.
func checkExactlyOnce(recs []txnRecord, nKeys, perKey int) txnVerdict {
	var v txnVerdict
	next := map[string]int{}
	seen := map[string]map[int]bool{}
	fault := func(format string, a ...any) {
		if v.err == nil {
			v.err = fmt.Errorf(format, a...)
		}
	}
	for _, r := range recs {
		if seen[r.key] == nil {
			seen[r.key] = map[int]bool{}
		}
		switch {
		case seen[r.key][r.n]:
			v.duplicates++
			fault("key %s: event %d came again", r.key, r.n)
			continue
		case r.n != next[r.key]:
			v.inversions++
			fault("key %s: event %d came when %d was next", r.key, r.n, next[r.key])
		}
		seen[r.key][r.n] = true
		next[r.key] = max(next[r.key], r.n+1)
	}
	if len(seen) != nKeys {
		fault("%d keys came, want %d", len(seen), nKeys)
	}
	for k, s := range seen {
		if len(s) != perKey {
			v.missing += perKey - len(s)
			fault("key %s: %d of its %d events came", k, len(s), perKey)
		}
	}
	return v
}

// withQuery adds a query parameter to a URL that may have none yet.
func withQuery(url, param string) string {
	if strings.Contains(url, "?") {
		return url + "&" + param
	}
	return url + "?" + param
}

// The broker cut off mid-drain, many times: a transactional relay's commits fail or their answers
// are lost, it asks the broker what its group last committed when the broker answers again (from
// a new client), and a read_committed consumer still reads each event once, in each key's order.
func TestKafkaTxn_BrokerCutOffMidDrainNothingTwice(t *testing.T) {
	t.Parallel()
	proxy, url := kafkaBehindProxy(t)
	pg := testenv.NewPG(t)
	db := pgDB(pg)
	topic := testenv.UniqueName(t, "cut") + ".placed"
	createKafkaTopic(t, url, topic, 4)
	const nKeys, perKey = 30, 100
	writeEvents(t, db, topic, keys(nKeys), perKey)
	b := openBackend(t, withQuery(url, "transactional_id="+testenv.UniqueName(t, "relay")), kafkaOpts)
	reg := prometheus.NewRegistry()
	relay := newRelay(t, db, b.Publisher, func(c *forwarder.Config) {
		c.BatchSize, c.PublishTimeout = 50, 2*time.Second
		c.CircuitWatch = 50 * time.Millisecond
		c.Metrics = prom.NewForwarderMetrics(reg)
	})
	storetest.RunForwarder(t, relay)
	published := func() int { return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NOT NULL`) }
	for cut := 1; cut <= 4; cut++ {
		before := published()
		if before == nKeys*perKey {
			break
		}
		testenv.Eventually(t, 60*time.Second, "the relay to publish more", func() bool { return published() > before })
		proxy.Cut()
		<-time.After(500 * time.Millisecond) // the outage's length
		proxy.Restore()
	}
	testenv.Eventually(t, 2*time.Minute, "every row to be published", func() bool { return published() == nKeys*perKey })
	recs := readCommitted(t, url, topic, nKeys*perKey)
	if d := checkExactlyOnce(recs, nKeys, perKey); d.err != nil {
		t.Fatalf("read_committed after outages: %v", d.err)
	}
	outcomes := map[string]float64{}
	for _, o := range []string{"committed", "aborted", "unknown"} {
		outcomes[o] = metricValue(t, reg, "outboxkit_forwarder_transactions_total", map[string]string{"outcome": o})
	}
	t.Logf("transactions: %v", outcomes)
	if outcomes["aborted"]+outcomes["unknown"] == 0 {
		t.Fatal("no cut-off hit a transaction: the test proves nothing")
	}
}

// A group that has read everything a transactional relay committed waits for nothing: the lag
// reader does not count the commit marker after the last record, which a caught-up group never
// commits past — or every consumer of a transactional topic would show one waiting message per
// partition, for ever.
func TestKafkaTxn_CaughtUpGroupHasNoLag(t *testing.T) {
	t.Parallel()
	url := testenv.KafkaURL(t)
	pg := testenv.NewPG(t)
	db := pgDB(pg)
	createEffects(t, db)
	topic := testenv.UniqueName(t, "lag") + ".placed"
	createKafkaTopic(t, url, topic, 2)
	writeEvents(t, db, topic, keys(4), 5)
	b := openBackend(t, withQuery(url, "transactional_id="+testenv.UniqueName(t, "relay")), kafkaOpts)
	storetest.RunForwarder(t, newRelay(t, db, b.Publisher))
	group := testenv.UniqueName(t, "billing")
	startEffectConsumer(t, context.Background(), db, b, topic, group)
	testenv.Eventually(t, 60*time.Second, "every event applied", func() bool { return countEffects(t, db, group) == 20 })
	var lag backends.Lag
	testenv.Eventually(t, 30*time.Second, "the group's lag to reach 0", func() bool {
		var err error
		lag, err = b.Lag(context.Background(), topic, group)
		return err == nil && lag.Waiting == 0
	})
	if lag.HasAge && lag.OldestAge > 0 {
		t.Errorf("a caught-up group's oldest waiting message is %s old", lag.OldestAge)
	}
}
