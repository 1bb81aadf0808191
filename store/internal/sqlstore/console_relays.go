package sqlstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

// relayForgetAfter is how long a relay's last heartbeat is kept: a relay that stopped shows as
// gone meanwhile.
const relayForgetAfter = 24 * time.Hour

// relayForgetEvery is how often, at most, a store forgets old relays.
const relayForgetEvery = 10 * time.Minute

func (s *Store) RelayHeartbeat(ctx context.Context, b store.RelayBeat) error {
	c := s.d.Console()
	byTopic, err := json.Marshal(b.PublishedByTopic)
	if err != nil || b.PublishedByTopic == nil {
		byTopic = []byte("{}")
	}
	if _, err := s.db.Exec(ctx, c.render(c.UpsertRelay), b.Owner, b.Name, b.Host, b.PID, s.d.Time(b.Started), s.d.Time(b.At),
		s.d.NullTime(b.LastPass), s.d.NullTime(b.LastPublish), s.d.NullTime(b.CircuitOpenSince), b.Blocked, b.PublishedTotal,
		string(byTopic), s.d.NullTime(b.PausesSeen)); err != nil {
		return fmt.Errorf("record relay heartbeat: %w", s.d.Classify(err))
	}
	// Forgetting runs at most every relayForgetEvery of heartbeat time per store: a relay's
	// heartbeat is otherwise two statements, and an idle outbox's main cost.
	last := s.relaysForgotten.Load()
	if last != 0 && b.At.UnixNano()-last < int64(relayForgetEvery) { // a heartbeat of an earlier time too
		return nil
	}
	if _, err := s.db.Exec(ctx, c.render(`DELETE FROM {{schema}}.relays WHERE heartbeat_at < ?1`), s.d.Time(b.At.Add(-relayForgetAfter))); err != nil {
		return fmt.Errorf("forget old relays: %w", s.d.Classify(err))
	}
	s.relaysForgotten.Store(b.At.UnixNano())
	return nil
}

func (s *Store) Relays(ctx context.Context) ([]store.RelayBeat, error) {
	rows, err := s.db.Query(ctx, s.d.Console().render(`SELECT owner, name, host, pid, started_at, heartbeat_at, last_pass_at, last_publish_at,
    circuit_open_since, blocked, published_total, published_by_topic, pauses_seen_at
FROM {{schema}}.relays ORDER BY name, owner`))
	if err != nil {
		return nil, fmt.Errorf("read relays: %w", s.d.Classify(err))
	}
	defer rows.Close()
	var out []store.RelayBeat
	for rows.Next() {
		var (
			b                                         store.RelayBeat
			started, at, pass, publish, circuit, seen dbexec.Time
			byTopic                                   []byte
		)
		if err := rows.Scan(&b.Owner, &b.Name, &b.Host, &b.PID, &started, &at, &pass, &publish, &circuit, &b.Blocked,
			&b.PublishedTotal, &byTopic, &seen); err != nil {
			return nil, fmt.Errorf("read relays: %w", s.d.Classify(err))
		}
		b.Started, b.At, b.LastPass, b.LastPublish, b.CircuitOpenSince, b.PausesSeen = started.Time, at.Time, pass.Time, publish.Time, circuit.Time, seen.Time
		_ = json.Unmarshal(byTopic, &b.PublishedByTopic)
		out = append(out, b)
	}
	return out, s.d.Classify(rows.Err())
}
