package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/forwarder/pglog"
	"github.com/outboxkit/outboxkit/internal/faults"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/pipeline"
)

// The log relay's transactional proof: log relay processes (forwarder/pglog) killed with SIGKILL
// at random points — in a checkpoint right after its transaction committed, before the table and
// the slot are told, and at a random instant (with a transaction open, in the start, in the
// recovery) — while the writers go on, and a consumer that reads only committed records, with no
// inbox, sees every event exactly once and each key in order; so does kcat (librdkafka) with
// isolation.level=read_committed. The first events are written before
// any relay ran (read by a backfill), the others while the relays come and go (read from the log).
//
// OUTBOXKIT_KAFKA_TXN_LOG_EVENTS and OUTBOXKIT_KAFKA_TXN_LOG_KILLS scale it.
func TestKafkaTxn_LogRelayKilledAtRandomPointsExactlyOnce(t *testing.T) {
	t.Parallel()
	events := envInt(t, "OUTBOXKIT_KAFKA_TXN_LOG_EVENTS", 4000)
	kills := envInt(t, "OUTBOXKIT_KAFKA_TXN_LOG_KILLS", 30)
	url := testenv.KafkaURL(t)
	const nKeys = 40
	perKey := events / nKeys
	pg := testenv.NewLogicalPG(t)
	db := pgDB(pg)
	topic := testenv.UniqueName(t, "logeos") + ".placed"
	createKafkaTopic(t, url, topic, 4)
	txnURL := withQuery(url, "transactional_id="+testenv.UniqueName(t, "logrelay"))
	dropLogRelaySlot(t, pg)

	first := perKey / 5
	writeEvents(t, db, topic, keys(nKeys), first)
	// The others are written a few events a key at a time while the relays come and go: each
	// process's share while it starts, beside it.
	perLife, next := max(1, (perKey-first+kills-1)/kills), first
	// The process learns its share is written from a file the writer makes once it is.
	writeShare := func() (wrote <-chan struct{}, marker string) {
		from, to := next, min(next+perLife, perKey)
		next = to
		marker = filepath.Join(t.TempDir(), "written")
		ch := make(chan struct{})
		go func() {
			defer close(ch)
			if from < to {
				writeEventsFrom(t, db, topic, keys(nKeys), from, to)
			}
			_ = os.WriteFile(marker, nil, 0o600)
		}()
		return ch, marker
	}

	byPoint := map[string]int{}
	recovered, done := 0, 0
	deadline := time.Now().Add(15 * time.Minute)
	for killed := 0; killed < kills; {
		if time.Now().After(deadline) {
			t.Fatalf("%d log relay processes killed in 15 minutes, want %d", killed, kills)
		}
		point := []string{"after_commit", "timer"}[rand.IntN(2)]
		wrote, marker := writeShare()
		code, out := runTxnLogRelay(t, pg, txnURL, point, 1+rand.IntN(4), marker)
		<-wrote
		recovered += recoveredRows(out)
		switch code {
		case -1:
			killed++
			byPoint[point]++
		case 0: // its point did not come in its lifetime
			done++
		default:
			t.Fatalf("log relay process exited with %d:\n%s", code, out)
		}
	}
	if next < perKey {
		writeEventsFrom(t, db, topic, keys(nKeys), next, perKey)
	}
	if code, out := runTxnLogRelay(t, pg, txnURL, "none", 0, ""); code != 0 {
		t.Fatalf("the last log relay process exited with %d:\n%s", code, out)
	} else {
		recovered += recoveredRows(out)
	}
	t.Logf("%d events, %d log relay processes killed (%v), %d lived out their time, %d committed rows recovered",
		nKeys*perKey, kills, byPoint, done, recovered)
	if byPoint["after_commit"] > 0 && recovered == 0 {
		t.Fatalf("%d relays died after their commit, before their checkpoint, and no successor found a committed row", byPoint["after_commit"])
	}
	recs := readCommitted(t, url, topic, nKeys*perKey)
	if d := checkExactlyOnce(recs, nKeys, perKey); d.err != nil {
		t.Fatalf("read_committed (franz-go): %v (%d duplicates, %d missing, %d inversions)", d.err, d.duplicates, d.missing, d.inversions)
	}
	if d := checkExactlyOnce(kcatReadCommitted(t, url, topic, nKeys*perKey), nKeys, perKey); d.err != nil {
		t.Fatalf("read_committed (kcat): %v", d.err)
	}
}

// writeEventsFrom writes events from..to-1 of each key, as writeEvents writes 0..perKey-1.
func writeEventsFrom(t testing.TB, db testDB, topic string, keys []string, from, to int) {
	t.Helper()
	var all []*message.Message
	for i := from; i < to; i++ {
		for _, k := range keys {
			all = append(all, pipeline.NewEvent("Happened", k, []byte(fmt.Sprintf(`{"key":%q,"n":%d}`, k, i))))
		}
	}
	db.Write(t, topic, all)
}

// dropLogRelaySlot drops the slot and publication of the log relay of pg's outbox (the
// forwarder's default Name) when the test ends.
func dropLogRelaySlot(t *testing.T, pg *testenv.PG) {
	t.Helper()
	f, err := forwarder.New(forwarder.Config{Store: pg.Store, Publisher: nopPublisher{}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := pglog.New(pglog.Config{Forwarder: f, Pool: pg.Pool})
	if err != nil {
		t.Fatal(err)
	}
	slot := r.SlotName()
	t.Cleanup(func() {
		testenv.Eventually(t, 20*time.Second, "slot "+slot+" dropped", func() bool {
			_, err := pg.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
			return err == nil
		})
		_, _ = pg.Pool.Exec(context.Background(), `DROP PUBLICATION IF EXISTS `+slot)
	})
}

// recoveredRows adds up the committed rows the log relays of out found their group's last
// transaction to list.
func recoveredRows(out string) int {
	n := 0
	for _, m := range regexp.MustCompile(`transactions over.*committed_rows=(\d+)`).FindAllStringSubmatch(out, -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	return n
}

// runTxnLogRelay runs one log relay process (TestHelperKafkaTxnLogRelay) and returns its exit
// code, -1 when it was killed, and its output.
func runTxnLogRelay(t *testing.T, pg *testenv.PG, kafkaURL, point string, at int, written string) (int, string) {
	t.Helper()
	return runKilledHelper(t, "TestHelperKafkaTxnLogRelay", "OUTBOXKIT_HELPER_KAFKA_TXN_LOG",
		pg.URL, string(pg.Schema), kafkaURL, point, strconv.Itoa(at), written)
}

// TestHelperKafkaTxnLogRelay is the log relay process of the proof: it kills its own process with
// SIGKILL at its point — "after_commit", in its at-th checkpoint that has something to record,
// which with transactions follows its commit; "timer", at a random instant up to at×100 ms from
// its start — or exits once its share of the writes (written: the file the writer makes when done)
// is relayed, or after 3 seconds, if the point did not come; with point "none" it exits once
// the outbox is drained.
func TestHelperKafkaTxnLogRelay(t *testing.T) {
	spec := os.Getenv("OUTBOXKIT_HELPER_KAFKA_TXN_LOG")
	if spec == "" {
		return // only meaningful as the subprocess
	}
	p := strings.Split(spec, "|")
	at, _ := strconv.Atoi(p[4])
	pg := testenv.AttachPG(t, p[0], p[1])
	b := openBackend(t, p[2], kafkaOpts)
	f, err := forwarder.New(forwarder.Config{Store: pg.Store, Publisher: b.Publisher, MaxInFlight: 16,
		Backoff: forwarder.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2},
		Logger:  watermill.NewStdLogger(false, false)}) // its parent counts the recoveries it logs
	if err != nil {
		t.Fatal(err)
	}
	relay, err := pglog.New(pglog.Config{Forwarder: f, Pool: pg.Pool, FlushRows: 20 + rand.IntN(80),
		FlushInterval: time.Duration(20+rand.IntN(80)) * time.Millisecond, StatusInterval: time.Duration(20+rand.IntN(300)) * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	die := func() error {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
	switch p[3] {
	case "after_commit":
		var flushes atomic.Int64
		faults.InjectBeforeConfirm(relay, func() error {
			if flushes.Add(1) == int64(at) {
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
	select { // drained counts once the relay reads: the outbox is empty between two writes too
	case <-relay.Reading():
	case err := <-done:
		t.Fatalf("log relay ended before reading its slot: %v", err)
	}
	drained := func() bool { return pg.Int(t, `SELECT count(*) FROM {{schema}}.outbox`) == 0 }
	writesDone := func() bool { _, err := os.Stat(p[5]); return err == nil }
	if p[3] == "none" {
		testenv.Eventually(t, 5*time.Minute, "the outbox to be drained", drained)
	} else {
		// It waits for its point, which kills it, until its share of the writes is relayed and
		// checkpointed (or 3 s have passed): then nothing more brings its point.
		testenv.Within(3*time.Second, func() bool { return writesDone() && drained() })
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
