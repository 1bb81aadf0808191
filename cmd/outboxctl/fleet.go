package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/store"
)

// FleetStatus is the JSON of "outboxctl fleet status --json": fleet.Status with its ages in
// seconds, and the outboxes that need an operator named first.
type FleetStatus struct {
	Fleet string `json:"fleet"`
	// Now is the coordination database's clock: every age is measured from it.
	Now         time.Time `json:"now"`
	LiveMembers int       `json:"live_members"`
	// Unowned names the enabled outboxes that no member relays; OwnerStale those whose owner holds
	// the lease without a live heartbeat. --check fails when either is not empty.
	Unowned    []string            `json:"unowned"`
	OwnerStale []string            `json:"owner_stale"`
	Members    []FleetMemberStatus `json:"members"`
	Outboxes   []FleetOutboxStatus `json:"outboxes"`
}

// FleetMemberStatus is one member of the fleet.
type FleetMemberStatus struct {
	Name    string    `json:"name"`
	Live    bool      `json:"live"`
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
	// Owned is how many outboxes it holds a lease on now.
	Owned               int       `json:"owned"`
	HeartbeatAt         time.Time `json:"heartbeat_at"`
	HeartbeatAgeSeconds float64   `json:"heartbeat_age_seconds"`
	ExpiresAt           time.Time `json:"expires_at"`
}

// FleetOutboxStatus is one outbox of the fleet. The backlog's fields are absent until an owner
// has read it.
type FleetOutboxStatus struct {
	Name     string `json:"name"`
	Tenant   string `json:"tenant"`
	Disabled bool   `json:"disabled"`
	// Owner is "" while nobody holds its lease; Token is its fencing token, or the last one given.
	Owner             string  `json:"owner"`
	Token             int64   `json:"token"`
	OwnerStale        bool    `json:"owner_stale"`
	LeaseAgeSeconds   float64 `json:"lease_age_seconds"`
	RenewedAgoSeconds float64 `json:"renewed_ago_seconds"`
	// UnownedForSeconds is how long an enabled outbox has had no owner (0 while owned).
	UnownedForSeconds       float64  `json:"unowned_for_seconds"`
	Pending                 *int64   `json:"pending,omitempty"`
	OldestPendingAgeSeconds *float64 `json:"oldest_pending_age_seconds,omitempty"`
	StatsAgeSeconds         *float64 `json:"stats_age_seconds,omitempty"`
	Error                   string   `json:"error,omitempty"`
	RecordedBy              string   `json:"recorded_by"`
}

// fleetCmd runs "outboxctl fleet SUBCOMMAND".
func (e *env) fleetCmd(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usagef("fleet takes: status")
	}
	switch args[0] {
	case "status":
		return e.fleetStatus(ctx, args[1:])
	}
	return usagef("unknown command %q: fleet takes status", "fleet "+args[0])
}

func (e *env) fleetStatus(ctx context.Context, args []string) error {
	fs := e.flags("fleet status")
	name := fs.String("fleet", os.Getenv("OUTBOXKIT_FLEET"), "the fleet's name, as its members are given it (env OUTBOXKIT_FLEET)")
	asJSON := fs.Bool("json", false, "print JSON")
	check := fs.Bool("check", false, "exit 1, naming them, when an enabled outbox has no owner or a stale one (for a cron job or a probe)")
	if err := parse(fs, args, e.stdout); err != nil {
		return err
	}
	if *name == "" {
		return usagef("fleet status: pass --fleet NAME (or set OUTBOXKIT_FLEET): the name the fleet's members are given")
	}
	db, err := e.connect(ctx, false)
	if err != nil {
		return err
	}
	defer db.Close()
	fc, ok := store.FleetControlOf(db)
	if !ok {
		return store.ErrNoFleetControl
	}
	st, err := fleet.ReadStatus(ctx, fc, *name)
	if err != nil {
		return err
	}
	if len(st.Members) == 0 && len(st.Outboxes) == 0 {
		return fmt.Errorf("fleet %q is unknown to %s %s: no member has joined it; check --fleet, and that --db (and --schema) name the coordination database its members are given",
			*name, db.Info().Name, db.Info().Schema)
	}
	out := fleetStatusJSON(st)
	if *asJSON {
		if err := json.NewEncoder(e.stdout).Encode(out); err != nil {
			return err
		}
	} else if err := printFleetStatus(e.stdout, st, out); err != nil {
		return err
	}
	if *check {
		return checkFleet(st)
	}
	return nil
}

// outboxOrder puts first what needs an operator: no owner, then a stale owner, then the owned,
// then the disabled; by name within each.
func outboxOrder(o fleet.OutboxStatus) int {
	switch {
	case o.Unowned():
		return 0
	case o.OwnerStale:
		return 1
	case o.Disabled:
		return 3
	}
	return 2
}

func sortedOutboxes(st fleet.Status) []fleet.OutboxStatus {
	out := append([]fleet.OutboxStatus(nil), st.Outboxes...)
	sort.SliceStable(out, func(i, j int) bool { return outboxOrder(out[i]) < outboxOrder(out[j]) })
	return out
}

func fleetStatusJSON(st fleet.Status) FleetStatus {
	out := FleetStatus{Fleet: st.Fleet, Now: st.Now, LiveMembers: st.LiveMembers(), Unowned: []string{}, OwnerStale: []string{},
		Members: []FleetMemberStatus{}, Outboxes: []FleetOutboxStatus{}}
	for _, m := range st.Members {
		out.Members = append(out.Members, FleetMemberStatus{Name: m.Name, Live: m.Live, Host: m.Host, PID: m.PID, Started: m.Started,
			Owned: m.Owned, HeartbeatAt: m.HeartbeatAt, HeartbeatAgeSeconds: max(st.Now.Sub(m.HeartbeatAt), 0).Seconds(), ExpiresAt: m.ExpiresAt})
	}
	for _, o := range sortedOutboxes(st) {
		switch {
		case o.Unowned():
			out.Unowned = append(out.Unowned, o.Name)
		case o.OwnerStale:
			out.OwnerStale = append(out.OwnerStale, o.Name)
		}
		j := FleetOutboxStatus{Name: o.Name, Tenant: o.Tenant, Disabled: o.Disabled, Owner: o.Owner, Token: o.Token,
			OwnerStale: o.OwnerStale, LeaseAgeSeconds: o.LeaseAge.Seconds(), RenewedAgoSeconds: o.RenewedAgo.Seconds(),
			UnownedForSeconds: o.UnownedFor.Seconds(), Error: o.Error, RecordedBy: o.RecordedBy}
		if !o.StatsAt.IsZero() {
			pending, oldest, age := o.Pending, o.OldestPendingAge.Seconds(), o.StatsAge.Seconds()
			j.Pending, j.OldestPendingAgeSeconds, j.StatsAgeSeconds = &pending, &oldest, &age
		}
		out.Outboxes = append(out.Outboxes, j)
	}
	return out
}

func printFleetStatus(w io.Writer, st fleet.Status, out FleetStatus) error {
	var owned, disabled int
	for _, o := range st.Outboxes {
		switch {
		case o.Owner != "":
			owned++
		case o.Disabled:
			disabled++
		}
	}
	line := fmt.Sprintf("fleet %s: %d of %d members live; %d outboxes: %d owned", st.Fleet, out.LiveMembers, len(st.Members), len(st.Outboxes), owned)
	if n := len(out.OwnerStale); n > 0 {
		line += fmt.Sprintf(" (%d by a STALE owner)", n)
	}
	if n := len(out.Unowned); n > 0 {
		line += fmt.Sprintf(", %d WITHOUT AN OWNER", n)
	}
	if disabled > 0 {
		line += fmt.Sprintf(", %d disabled", disabled)
	}
	if _, err := fmt.Fprintln(w, line); err != nil {
		return err
	}
	if len(out.Unowned) > 0 {
		fmt.Fprintln(w, "\nWITHOUT AN OWNER (their events wait):")
		for _, o := range sortedOutboxes(st) {
			if !o.Unowned() {
				continue
			}
			why := ""
			if o.Error != "" {
				why = ": " + o.Error
			}
			fmt.Fprintf(w, "  %s (tenant %s) for %s%s\n", o.Name, o.Tenant, age(o.UnownedFor), why)
		}
	}

	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tLIVE\tOWNED\tHEARTBEAT\tHOST\tPID\tSTARTED")
	for _, m := range st.Members {
		live := "yes"
		if !m.Live {
			live = "NO"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s ago\t%s\t%d\t%s\n", m.Name, live, m.Owned, age(st.Now.Sub(m.HeartbeatAt)), dash(m.Host), m.PID,
			m.Started.UTC().Format(time.RFC3339))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "OUTBOX\tTENANT\tOWNER\tTOKEN\tLEASE AGE\tUNOWNED FOR\tPENDING\tOLDEST\tREAD\tERROR")
	for _, o := range sortedOutboxes(st) {
		owner, leaseAge, unowned := o.Owner, age(o.LeaseAge), "-"
		switch {
		case o.Owner != "" && o.OwnerStale:
			owner += " (STALE)"
		case o.Disabled && o.Owner == "":
			owner, leaseAge = "disabled", "-"
		case o.Owner == "":
			owner, leaseAge, unowned = "NONE", "-", age(o.UnownedFor)
		}
		pending, oldest, read := "-", "-", "never"
		if !o.StatsAt.IsZero() {
			pending, oldest, read = fmt.Sprint(o.Pending), age(o.OldestPendingAge), age(o.StatsAge)+" ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", o.Name, dash(o.Tenant), owner, o.Token, leaseAge, unowned,
			pending, oldest, read, dash(o.Error))
	}
	return tw.Flush()
}

// checkFleet fails, naming them, when enabled outboxes have no owner or a stale one.
func checkFleet(st fleet.Status) error {
	var problems []string
	for _, o := range sortedOutboxes(st) {
		switch {
		case o.Unowned():
			problems = append(problems, fmt.Sprintf("%s (tenant %s) has had no owner for %s", o.Name, o.Tenant, age(o.UnownedFor)))
		case o.OwnerStale:
			problems = append(problems, fmt.Sprintf("%s (tenant %s) is held by %s, whose heartbeat or renewal is overdue", o.Name, o.Tenant, o.Owner))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("fleet %s: %d outboxes need attention: %s", st.Fleet, len(problems), strings.Join(problems, "; "))
}

// age prints a duration to the second (to the millisecond below one).
func age(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
