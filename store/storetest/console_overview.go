package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit/store"
)

func consoleOverview[TTx any](t *testing.T, h Harness[TTx]) {
	t.Parallel()
	e := migrated(t, h)
	c := consoleOf(t, e)
	ctx := context.Background()
	writeTopics(t, e, [2]string{"a", "k1"}, [2]string{"a", "k2"}, [2]string{"b", "k1"})
	topics, capped, err := c.TopicBacklog(ctx, 2)
	if err != nil || !capped || len(topics) != 1 || topics[0].Topic != "a" || topics[0].Pending != 2 {
		t.Fatalf("backlog read to 2 rows: %+v, capped %v, %v", topics, capped, err)
	}
	topics, capped, err = c.TopicBacklog(ctx, 10)
	if err != nil || capped || len(topics) != 2 || topics[0].OldestCreated.IsZero() {
		t.Fatalf("whole backlog: %+v, capped %v, %v", topics, capped, err)
	}
	if _, err := e.Store.Session().Processed(ctx, "billing", "m-1", time.Now()); err != nil {
		t.Fatal(err)
	}
	if counts, err := c.ProcessedSince(ctx, time.Now().Add(-time.Hour), 100); err != nil || len(counts) != 0 {
		// Processed's inbox row was rolled back: nothing was processed.
		t.Fatalf("processed: %+v, %v", counts, err)
	}
	if parked, err := c.ParkedCounts(ctx); err != nil || len(parked) != 0 {
		t.Fatalf("parked: %+v, %v", parked, err)
	}
	beat := store.RelayBeat{Owner: "demo-1", Name: "demo", Host: "h", PID: 7, Started: time.Now(), At: time.Now(), PublishedTotal: 3,
		PublishedByTopic: map[string]int64{"a": 3}, PausesSeen: time.Now()}
	for i := 0; i < 2; i++ {
		beat.PublishedTotal += int64(i)
		if err := c.RelayHeartbeat(ctx, beat); err != nil {
			t.Fatal(err)
		}
	}
	relays, err := c.Relays(ctx)
	if err != nil || len(relays) != 1 || relays[0].PublishedTotal != 4 || relays[0].PublishedByTopic["a"] != 3 || !relays[0].LastPass.IsZero() {
		t.Fatalf("relays: %+v, %v", relays, err)
	}
	// A relay silent for a day is forgotten, by a later heartbeat of another — at most every ten
	// minutes of heartbeat time, so that a heartbeat is one statement in between.
	gone := store.RelayBeat{Owner: "gone-1", Name: "gone", Host: "h", Started: beat.At, At: beat.At.Add(time.Minute)}
	if err := c.RelayHeartbeat(ctx, gone); err != nil {
		t.Fatal(err)
	}
	later := beat
	later.At = gone.At.Add(24*time.Hour + time.Minute)
	if err := c.RelayHeartbeat(ctx, later); err != nil {
		t.Fatal(err)
	}
	if relays, err := c.Relays(ctx); err != nil || len(relays) != 1 || relays[0].Owner != "demo-1" {
		t.Fatalf("relays after a day's silence of one: %+v, %v", relays, err)
	}
	gone.At = later.At.Add(-25 * time.Hour) // written late: already a day old
	if err := c.RelayHeartbeat(ctx, gone); err != nil {
		t.Fatal(err)
	}
	later.At = later.At.Add(time.Minute)
	if err := c.RelayHeartbeat(ctx, later); err != nil {
		t.Fatal(err)
	}
	if relays, err := c.Relays(ctx); err != nil || len(relays) != 2 {
		t.Fatalf("forgotten again within ten minutes (a heartbeat is one statement between): %+v, %v", relays, err)
	}
	later.At = later.At.Add(10 * time.Minute)
	if err := c.RelayHeartbeat(ctx, later); err != nil {
		t.Fatal(err)
	}
	if relays, err := c.Relays(ctx); err != nil || len(relays) != 1 {
		t.Fatalf("not forgotten ten minutes later: %+v, %v", relays, err)
	}
	for i, action := range []string{"replay", "pause"} {
		if err := c.Audit(ctx, store.AuditEntry{At: time.Now(), Actor: "alice", Role: "operator", Action: action, Matched: int64(i),
			Result: "ok", OK: i == 0}); err != nil {
			t.Fatal(err)
		}
	}
	log, err := c.AuditLog(ctx, 0, 10)
	if err != nil || len(log) != 2 || log[0].Action != "pause" || log[0].OK || !log[1].OK {
		t.Fatalf("audit, newest first: %+v, %v", log, err)
	}
	if older, err := c.AuditLog(ctx, log[0].ID, 10); err != nil || len(older) != 1 || older[0].Action != "replay" {
		t.Fatalf("audit before the newest: %+v, %v", older, err)
	}
	cur, newest, err := c.SchemaVersion(ctx)
	if err != nil || cur != newest || cur == 0 {
		t.Fatalf("schema version %d of %d, %v", cur, newest, err)
	}
}
