package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/internal/dbexec"
)

// FleetSQL is what a relay fleet's statements (store.FleetControl) need of a dialect. The
// statements that differ only by the clock are written once, here, with ?N parameters and
// {{now}} and {{later ?N}}; the three that differ in their upsert are the dialect's own.
type FleetSQL struct {
	// Now is the database's clock as an expression, the same at every use within a statement.
	Now string
	// Later is a format of one parameter, a duration in microseconds (negative: earlier): the
	// database's clock that much later.
	Later string
	// Returning: the dialect's upserts return what they wrote, and an UPDATE takes RETURNING.
	Returning bool
	// RowValues goes before a list of row values on the right of IN: "VALUES " where the
	// database takes several rows there only as a subquery (SQLite).
	RowValues string
	// UpsertMember(fleet, member, host, pid, started, owned, ttl µs) records a heartbeat, with
	// Returning giving back heartbeat_at.
	UpsertMember string
	// AcquireLease(fleet, outbox, member, ttl µs) gives the lease to member unless another holds
	// it: a new lease has token 1, one taken from nobody (released or expired) the next token,
	// member's own keeps its token. One statement, atomic under concurrent callers. With
	// Returning, it gives back leaseColumns when member holds the lease.
	AcquireLease string
	// RecordOutboxes(fleet, member, then seven values a row: outbox, tenant, disabled, pending,
	// oldest pending µs, stats set, error) upserts the rows RecordFleetOutboxes writes in place of
	// {{rows}} (every column of fleet_outboxes, in order), keeping first_recorded_at, and keeping
	// the backlog columns where the row's stats_at is NULL.
	RecordOutboxes string
}

// Fleet statements are given batches of at most this many rows: a few hundred parameters.
const (
	outboxesPerStatement = 100
	leasesPerStatement   = 500
)

// forgetMembersAfter is how long after its heartbeat expired a member is kept (shown as dead).
const forgetMembersAfter = 24 * time.Hour

const leaseColumns = `outbox, owner, token, acquired_at, renewed_at, expires_at`

var laterParam = regexp.MustCompile(`\{\{later (\?\d+)\}\}`)

// fleetSQL renders one of the fleet's statements in the store's dialect.
func (s *Store) fleetSQL(q string) string {
	f := s.d.Fleet()
	q = strings.ReplaceAll(q, "{{now}}", f.Now)
	q = laterParam.ReplaceAllStringFunc(q, func(m string) string {
		return fmt.Sprintf(f.Later, laterParam.FindStringSubmatch(m)[1])
	})
	return s.d.Console().render(q)
}

func micros(d time.Duration) int64 { return d.Microseconds() }

// dbNow reads the database's clock.
func (s *Store) dbNow(ctx context.Context) (time.Time, error) {
	var now dbexec.Time
	if err := s.db.QueryRow(ctx, s.fleetSQL(`SELECT {{now}}`)).Scan(&now); err != nil {
		return time.Time{}, s.d.Classify(err)
	}
	return now.Time, nil
}

var _ store.FleetControl = (*Store)(nil)

// checkFleet refuses an empty fleet name or an empty name among named (what, name pairs).
func checkFleet(fleet string, named ...string) error {
	if fleet == "" {
		return errors.New("the fleet has no name: name it (every member of a fleet uses the same name)")
	}
	for i := 0; i+1 < len(named); i += 2 {
		if named[i+1] == "" {
			return fmt.Errorf("fleet %s: the %s has no name", fleet, named[i])
		}
	}
	return nil
}

// checkTerm refuses a term that is not positive.
func checkTerm(fleet, what string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("fleet %s: %s is %s: it must be positive", fleet, what, d)
	}
	return nil
}

func (s *Store) FleetHeartbeat(ctx context.Context, fleet string, m store.FleetMember, ttl time.Duration) (time.Time, error) {
	if err := errors.Join(checkFleet(fleet, "member", m.Name), checkTerm(fleet, "the heartbeat's term", ttl)); err != nil {
		return time.Time{}, err
	}
	f := s.d.Fleet()
	args := []any{fleet, m.Name, m.Host, m.PID, s.d.NullTime(m.Started), m.Owned, micros(ttl)}
	var at dbexec.Time
	if f.Returning {
		if err := s.db.QueryRow(ctx, s.fleetSQL(f.UpsertMember), args...).Scan(&at); err != nil {
			return time.Time{}, fmt.Errorf("record the heartbeat of member %s of fleet %s: %w", m.Name, fleet, s.d.Classify(err))
		}
	} else if _, err := s.db.Exec(ctx, s.fleetSQL(f.UpsertMember), args...); err != nil {
		return time.Time{}, fmt.Errorf("record the heartbeat of member %s of fleet %s: %w", m.Name, fleet, s.d.Classify(err))
	} else if err := s.db.QueryRow(ctx, s.fleetSQL(`SELECT heartbeat_at FROM {{schema}}.fleet_members WHERE fleet = ?1 AND member = ?2`),
		fleet, m.Name).Scan(&at); err != nil {
		return time.Time{}, fmt.Errorf("record the heartbeat of member %s of fleet %s: %w", m.Name, fleet, s.d.Classify(err))
	}
	if _, err := s.db.Exec(ctx, s.fleetSQL(`DELETE FROM {{schema}}.fleet_members WHERE fleet = ?1 AND expires_at < {{later ?2}}`),
		fleet, micros(-forgetMembersAfter)); err != nil {
		return time.Time{}, fmt.Errorf("forget the dead members of fleet %s: %w", fleet, s.d.Classify(err))
	}
	return at.Time, nil
}

func (s *Store) FleetMembers(ctx context.Context, fleet string) ([]store.FleetMember, time.Time, error) {
	rows, err := s.db.Query(ctx, s.fleetSQL(`SELECT member, host, pid, started_at, owned, heartbeat_at, expires_at
FROM {{schema}}.fleet_members WHERE fleet = ?1`), fleet)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("read the members of fleet %s: %w", fleet, s.d.Classify(err))
	}
	defer rows.Close()
	var out []store.FleetMember
	for rows.Next() {
		var (
			m                    store.FleetMember
			started, beat, until dbexec.Time
		)
		if err := rows.Scan(&m.Name, &m.Host, &m.PID, &started, &m.Owned, &beat, &until); err != nil {
			return nil, time.Time{}, fmt.Errorf("read the members of fleet %s: %w", fleet, s.d.Classify(err))
		}
		m.Started, m.HeartbeatAt, m.ExpiresAt = started.Time, beat.Time, until.Time
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, time.Time{}, fmt.Errorf("read the members of fleet %s: %w", fleet, s.d.Classify(err))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	now, err := s.dbNow(ctx)
	return out, now, err
}

func (s *Store) LeaveFleet(ctx context.Context, fleet, member string) error {
	if err := checkFleet(fleet, "member", member); err != nil {
		return err
	}
	err := s.inTx(ctx, func(tx dbexec.Tx) error {
		if _, err := tx.Exec(ctx, s.fleetSQL(`DELETE FROM {{schema}}.fleet_members WHERE fleet = ?1 AND member = ?2`), fleet, member); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, s.fleetSQL(releaseSet+` WHERE fleet = ?1 AND owner = ?2`), fleet, member)
		return err
	})
	if err != nil {
		return fmt.Errorf("member %s leaves fleet %s: %w", member, fleet, err)
	}
	return nil
}

// releaseSet frees a lease and keeps its token; a lease that had expired already keeps the time it
// ended.
const releaseSet = `UPDATE {{schema}}.fleet_leases SET owner = '', expires_at = CASE WHEN expires_at > {{now}} THEN {{now}} ELSE expires_at END`

func scanLease(row dbexec.Row, extra ...any) (store.Lease, error) {
	var (
		l                      store.Lease
		acquired, renewed, end dbexec.Time
	)
	if err := row.Scan(append([]any{&l.Outbox, &l.Owner, &l.Token, &acquired, &renewed, &end}, extra...)...); err != nil {
		return l, err
	}
	l.AcquiredAt, l.RenewedAt, l.ExpiresAt = acquired.Time, renewed.Time, end.Time
	return l, nil
}

func (s *Store) AcquireLease(ctx context.Context, fleet, outbox, member string, ttl time.Duration) (store.Lease, bool, error) {
	if err := errors.Join(checkFleet(fleet, "outbox", outbox, "member", member), checkTerm(fleet, "the lease's term", ttl)); err != nil {
		return store.Lease{}, false, err
	}
	fail := func(err error) (store.Lease, bool, error) {
		return store.Lease{}, false, fmt.Errorf("member %s of fleet %s acquires the lease of outbox %s: %w", member, fleet, outbox, s.d.Classify(err))
	}
	f := s.d.Fleet()
	args := []any{fleet, outbox, member, micros(ttl)}
	if f.Returning {
		l, err := scanLease(s.db.QueryRow(ctx, s.fleetSQL(f.AcquireLease), args...))
		if err == nil {
			return l, true, nil
		}
		if !errors.Is(err, dbexec.ErrNoRows) {
			return fail(err)
		}
	} else if _, err := s.db.Exec(ctx, s.fleetSQL(f.AcquireLease), args...); err != nil {
		return fail(err)
	}
	// Another member holds it (with Returning), or the upsert's outcome is read back.
	var now dbexec.Time
	l, err := scanLease(s.db.QueryRow(ctx, s.fleetSQL(`SELECT `+leaseColumns+`, {{now}} FROM {{schema}}.fleet_leases WHERE fleet = ?1 AND outbox = ?2`),
		fleet, outbox), &now)
	if err != nil {
		return fail(err)
	}
	return l, !f.Returning && l.Owner == member && l.Held(now.Time), nil
}

// leasePairs is the list of (outbox, token) row values of held, as parameters from ?first on.
func (s *Store) leasePairs(held []store.Lease, first int) (string, []any) {
	var b strings.Builder
	b.WriteString(s.d.Fleet().RowValues)
	args := make([]any, 0, 2*len(held))
	for i, l := range held {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "(?%d, ?%d)", first+2*i, first+2*i+1)
		args = append(args, l.Outbox, l.Token)
	}
	return b.String(), args
}

func (s *Store) RenewLeases(ctx context.Context, fleet, member string, held []store.Lease, ttl time.Duration) ([]store.Lease, error) {
	if err := errors.Join(checkFleet(fleet, "member", member), checkTerm(fleet, "the lease's term", ttl)); err != nil {
		return nil, err
	}
	f := s.d.Fleet()
	var out []store.Lease
	for len(held) > 0 {
		batch := held[:min(len(held), leasesPerStatement)]
		held = held[len(batch):]
		pairs, pairArgs := s.leasePairs(batch, 4)
		// Only the leases member still holds, with the same token and unexpired, are extended.
		where := ` WHERE fleet = ?1 AND owner = ?2 AND expires_at > {{now}} AND (outbox, token) IN (` + pairs + `)`
		args := append([]any{fleet, member, micros(ttl)}, pairArgs...)
		update := `UPDATE {{schema}}.fleet_leases SET renewed_at = {{now}}, expires_at = {{later ?3}}` + where
		var (
			rows dbexec.Rows
			err  error
		)
		if f.Returning {
			rows, err = s.db.Query(ctx, s.fleetSQL(update+` RETURNING `+leaseColumns), args...)
		} else if _, err = s.db.Exec(ctx, s.fleetSQL(update), args...); err == nil {
			// Read back what the update extended: a lease it left expired is expired still, and one
			// taken meanwhile has another owner or token.
			rows, err = s.db.Query(ctx, s.fleetSQL(`SELECT `+leaseColumns+` FROM {{schema}}.fleet_leases`+where), args...)
		}
		if err != nil {
			return nil, fmt.Errorf("member %s of fleet %s renews its leases: %w", member, fleet, s.d.Classify(err))
		}
		renewed, err := scanLeases(rows)
		if err != nil {
			return nil, fmt.Errorf("member %s of fleet %s renews its leases: %w", member, fleet, s.d.Classify(err))
		}
		out = append(out, renewed...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Outbox < out[j].Outbox })
	return out, nil
}

func scanLeases(rows dbexec.Rows) ([]store.Lease, error) {
	defer rows.Close()
	var out []store.Lease
	for rows.Next() {
		l, err := scanLease(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

func (s *Store) ReleaseLease(ctx context.Context, fleet, outbox, member string, token int64) error {
	if err := checkFleet(fleet, "outbox", outbox, "member", member); err != nil {
		return err
	}
	if _, err := s.db.Exec(ctx, s.fleetSQL(releaseSet+` WHERE fleet = ?1 AND outbox = ?2 AND owner = ?3 AND token = ?4`),
		fleet, outbox, member, token); err != nil {
		return fmt.Errorf("member %s of fleet %s releases the lease of outbox %s: %w", member, fleet, outbox, s.d.Classify(err))
	}
	return nil
}

func (s *Store) FleetLeases(ctx context.Context, fleet string) ([]store.Lease, time.Time, error) {
	rows, err := s.db.Query(ctx, s.fleetSQL(`SELECT `+leaseColumns+` FROM {{schema}}.fleet_leases WHERE fleet = ?1`), fleet)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("read the leases of fleet %s: %w", fleet, s.d.Classify(err))
	}
	out, err := scanLeases(rows)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("read the leases of fleet %s: %w", fleet, s.d.Classify(err))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Outbox < out[j].Outbox })
	now, err := s.dbNow(ctx)
	return out, now, err
}

func (s *Store) RecordFleetOutboxes(ctx context.Context, fleet, member string, outboxes []store.FleetOutbox, forgetAfter time.Duration) error {
	if err := errors.Join(checkFleet(fleet, "member", member),
		checkTerm(fleet, "the time after which an outbox that no member records is forgotten", forgetAfter)); err != nil {
		return err
	}
	// One row per name (the last given wins), in name order: members recording the same catalog
	// at once lock its rows in the same order, so they wait for one another and never deadlock.
	byName := make(map[string]store.FleetOutbox, len(outboxes))
	for _, o := range outboxes {
		if o.Name == "" {
			return fmt.Errorf("fleet %s: member %s records an outbox without a name", fleet, member)
		}
		byName[o.Name] = o
	}
	sorted := make([]store.FleetOutbox, 0, len(byName))
	for _, o := range byName {
		sorted = append(sorted, o)
	}
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	record := s.d.Fleet().RecordOutboxes
	for len(sorted) > 0 {
		batch := sorted[:min(len(sorted), outboxesPerStatement)]
		sorted = sorted[len(batch):]
		var rows strings.Builder
		args := make([]any, 0, 2+7*len(batch))
		args = append(args, fleet, member)
		for i, o := range batch {
			if i > 0 {
				rows.WriteString(", ")
			}
			n := len(args)
			fmt.Fprintf(&rows, "(?1, ?%d, ?%d, ?%d, ?2, {{now}}, {{now}}, ?%d, ?%d, CASE WHEN ?%d THEN {{now}} END, ?%d)",
				n+1, n+2, n+3, n+4, n+5, n+6, n+7)
			args = append(args, o.Name, o.Tenant, o.Disabled, o.Pending, micros(o.OldestPendingAge), !o.StatsAt.IsZero(), o.Error)
		}
		if _, err := s.db.Exec(ctx, s.fleetSQL(strings.Replace(record, "{{rows}}", rows.String(), 1)), args...); err != nil {
			return fmt.Errorf("member %s records the outboxes of fleet %s: %w", member, fleet, s.d.Classify(err))
		}
	}
	if _, err := s.db.Exec(ctx, s.fleetSQL(`DELETE FROM {{schema}}.fleet_outboxes WHERE fleet = ?1 AND recorded_at < {{later ?2}}`),
		fleet, micros(-forgetAfter)); err != nil {
		return fmt.Errorf("forget the outboxes of fleet %s that no member records: %w", fleet, s.d.Classify(err))
	}
	return nil
}

func (s *Store) FleetOutboxes(ctx context.Context, fleet string) ([]store.FleetOutbox, time.Time, error) {
	rows, err := s.db.Query(ctx, s.fleetSQL(`SELECT outbox, tenant, disabled, recorded_by, recorded_at, first_recorded_at, pending,
    oldest_pending_us, stats_at, error FROM {{schema}}.fleet_outboxes WHERE fleet = ?1`), fleet)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("read the outboxes of fleet %s: %w", fleet, s.d.Classify(err))
	}
	defer rows.Close()
	var out []store.FleetOutbox
	for rows.Next() {
		var (
			o                     store.FleetOutbox
			oldest                int64
			recorded, first, stat dbexec.Time
		)
		if err := rows.Scan(&o.Name, &o.Tenant, &o.Disabled, &o.RecordedBy, &recorded, &first, &o.Pending, &oldest, &stat, &o.Error); err != nil {
			return nil, time.Time{}, fmt.Errorf("read the outboxes of fleet %s: %w", fleet, s.d.Classify(err))
		}
		o.RecordedAt, o.FirstRecordedAt, o.StatsAt = recorded.Time, first.Time, stat.Time
		o.OldestPendingAge = time.Duration(oldest) * time.Microsecond
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		return nil, time.Time{}, fmt.Errorf("read the outboxes of fleet %s: %w", fleet, s.d.Classify(err))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	now, err := s.dbNow(ctx)
	return out, now, err
}
