package sqlstore

import (
	"context"
	"fmt"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

func (s *Store) Audit(ctx context.Context, e store.AuditEntry) error {
	_, err := s.db.Exec(ctx, s.d.Console().render(`INSERT INTO {{schema}}.console_audit
    (at, actor, role, action, filter, matched, affected, job_id, result, ok) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)`),
		s.d.Time(e.At), e.Actor, e.Role, e.Action, e.Filter, e.Matched, e.Affected, e.JobID, e.Result, e.OK)
	if err != nil {
		return fmt.Errorf("record the audit of %s by %s: %w", e.Action, e.Actor, s.d.Classify(err))
	}
	return nil
}

func (s *Store) AuditLog(ctx context.Context, before int64, limit int) ([]store.AuditEntry, error) {
	if before <= 0 {
		before = 1<<63 - 1
	}
	rows, err := s.db.Query(ctx, s.d.Console().render(`SELECT id, at, actor, role, action, filter, matched, affected, job_id, result, ok
FROM {{schema}}.console_audit WHERE id < ?1 ORDER BY id DESC LIMIT ?2`), before, limit)
	if err != nil {
		return nil, fmt.Errorf("read the audit: %w", s.d.Classify(err))
	}
	defer rows.Close()
	var out []store.AuditEntry
	for rows.Next() {
		var (
			e  store.AuditEntry
			at dbexec.Time
		)
		if err := rows.Scan(&e.ID, &at, &e.Actor, &e.Role, &e.Action, &e.Filter, &e.Matched, &e.Affected, &e.JobID, &e.Result, &e.OK); err != nil {
			return nil, fmt.Errorf("read the audit: %w", s.d.Classify(err))
		}
		e.At = at.Time
		out = append(out, e)
	}
	return out, s.d.Classify(rows.Err())
}
