package sqlstore

import (
	"context"
	"fmt"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

func (s *Store) Pauses(ctx context.Context) ([]store.Pause, error) {
	rows, err := s.db.Query(ctx, s.d.Console().render(`SELECT scope, name, paused_by, reason, paused_at FROM {{schema}}.pauses ORDER BY scope, name`))
	if err != nil {
		return nil, fmt.Errorf("read pauses: %w", s.d.Classify(err))
	}
	defer rows.Close()
	var out []store.Pause
	for rows.Next() {
		var (
			p  store.Pause
			at dbexec.Time
		)
		if err := rows.Scan(&p.Scope, &p.Name, &p.By, &p.Reason, &at); err != nil {
			return nil, fmt.Errorf("read pauses: %w", s.d.Classify(err))
		}
		p.At = at.Time
		out = append(out, p)
	}
	return out, s.d.Classify(rows.Err())
}

func (s *Store) SetPause(ctx context.Context, p store.Pause) (bool, error) {
	if p.Scope != store.PauseTopic && p.Scope != store.PauseRelay {
		return false, fmt.Errorf("pause: scope %q is neither %q nor %q", p.Scope, store.PauseTopic, store.PauseRelay)
	}
	c := s.d.Console()
	n, err := s.db.Exec(ctx, c.render(`{{insert_ignore}} {{schema}}.pauses (scope, name, paused_by, reason, paused_at)
VALUES (?1, ?2, ?3, ?4, ?5){{on_conflict_nothing}}`), p.Scope, p.Name, p.By, p.Reason, s.d.Time(p.At))
	if err != nil {
		return false, fmt.Errorf("pause %s %s: %w", p.Scope, p.Name, s.d.Classify(err))
	}
	return n == 1, nil
}

func (s *Store) ClearPause(ctx context.Context, scope, name string) (bool, error) {
	n, err := s.db.Exec(ctx, s.d.Console().render(`DELETE FROM {{schema}}.pauses WHERE scope = ?1 AND name = ?2`), scope, name)
	if err != nil {
		return false, fmt.Errorf("resume %s %s: %w", scope, name, s.d.Classify(err))
	}
	return n == 1, nil
}
