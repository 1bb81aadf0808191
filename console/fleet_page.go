package console

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/store"
)

// fleetView is the fleet page: the whole fleet's figures, its members, and one page of its
// outboxes, those that need an operator first.
type fleetView struct {
	Fleet       string
	Now         time.Time
	Members     []fleetMember
	LiveMembers int
	// Of the whole fleet, whatever the filter: enabled outboxes, those with no owner, a stale
	// owner or an error, and the rows pending.
	Enabled, Unowned, Stale, Failing int
	Pending                          int64
	// Unrecorded counts the catalog's outboxes that no member has recorded.
	Unrecorded int
	// Q is the tenant filter; Matched how many outboxes it matches; Rows the page of them shown,
	// From and To their places (1-based) among Matched.
	Q                string
	Matched          int
	Rows             []fleetRow
	From, To         int
	PrevURL, NextURL string
	// NoCatalog: the catalog could not be read yet, so no tenant links to its console.
	NoCatalog bool
}

type fleetMember struct {
	fleet.MemberStatus
	HeartbeatAge time.Duration
	Up           time.Duration
}

// fleetRow is one outbox on the fleet page.
type fleetRow struct {
	fleet.OutboxStatus
	// State is "unowned", "stale", "failing", "owned" or "disabled".
	State string
	// Link is its tenant's console, "" when the catalog does not list it.
	Link string
	// Unrecorded: the catalog lists it and no member has recorded it (no member runs with this
	// catalog, or none is live): nobody relays it.
	Unrecorded bool
}

// rowOrder puts first what needs an operator: no owner, then a stale owner, then an owner that
// cannot open or read it, then the owned, then the disabled.
var rowOrder = map[string]int{"unowned": 0, "stale": 1, "failing": 2, "owned": 3, "disabled": 4}

func rowState(o fleet.OutboxStatus) string {
	switch {
	case o.Unowned():
		return "unowned"
	case o.OwnerStale:
		return "stale"
	case o.Disabled:
		return "disabled"
	case o.Error != "":
		return "failing"
	}
	return "owned"
}

// buildFleetView merges the status with the catalog (an outbox no member recorded is unowned
// too), sorts, filters by q (a substring of the tenant or the name, any case) and cuts page n.
func (f *fleetConsole) buildFleetView(st fleet.Status, cat *catalogView, q string, n int) fleetView {
	v := fleetView{Fleet: st.Fleet, Now: st.Now, Q: q, NoCatalog: cat == nil}
	for _, m := range st.Members {
		v.Members = append(v.Members, fleetMember{MemberStatus: m, HeartbeatAge: max(st.Now.Sub(m.HeartbeatAt), 0), Up: max(st.Now.Sub(m.Started), 0)})
		if m.Live {
			v.LiveMembers++
		}
	}
	slices.SortStableFunc(v.Members, func(a, b fleetMember) int {
		if a.Live != b.Live { // the live first
			if a.Live {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	recorded := map[string]bool{}
	var rows []fleetRow
	for _, o := range st.Outboxes {
		recorded[o.Name] = true
		rows = append(rows, fleetRow{OutboxStatus: o, State: rowState(o)})
	}
	if cat != nil {
		for _, o := range cat.outboxes {
			if !recorded[o.Name] {
				rows = append(rows, fleetRow{OutboxStatus: fleet.OutboxStatus{FleetOutbox: store.FleetOutbox{Name: o.Name, Tenant: o.Tenant, Disabled: o.Disabled}},
					Unrecorded: true})
				rows[len(rows)-1].State = rowState(rows[len(rows)-1].OutboxStatus)
				if !o.Disabled {
					v.Unrecorded++
				}
			}
		}
	}
	for i := range rows {
		r := &rows[i]
		if r.Tenant == "" {
			r.Tenant = r.Name
		}
		if o, ok := cat.named(r.Name); ok {
			r.Link = f.root.cfg.Prefix + "/t/" + pathKey(cat.segment(o)) + "/"
		}
		if !r.Disabled {
			v.Enabled++
		}
		switch r.State {
		case "unowned":
			v.Unowned++
		case "stale":
			v.Stale++
		}
		if r.Error != "" {
			v.Failing++
		}
		v.Pending += r.Pending
	}
	slices.SortStableFunc(rows, func(a, b fleetRow) int {
		if d := rowOrder[a.State] - rowOrder[b.State]; d != 0 {
			return d
		}
		return strings.Compare(a.Name, b.Name)
	})
	if q != "" {
		lq := strings.ToLower(q)
		rows = slices.DeleteFunc(rows, func(r fleetRow) bool {
			return !strings.Contains(strings.ToLower(r.Tenant), lq) && !strings.Contains(strings.ToLower(r.Name), lq)
		})
	}
	v.Matched = len(rows)
	size := f.cfg.PageSize
	pages := max(1, (len(rows)+size-1)/size)
	n = min(max(n, 1), pages)
	lo, hi := (n-1)*size, min(n*size, len(rows))
	v.Rows = rows[lo:hi]
	v.From, v.To = lo+1, hi
	link := func(page int) string {
		u := url.Values{}
		if q != "" {
			u.Set("q", q)
		}
		if page > 1 {
			u.Set("page", strconv.Itoa(page))
		}
		if len(u) == 0 {
			return f.root.cfg.Prefix + "/"
		}
		return f.root.cfg.Prefix + "/?" + u.Encode()
	}
	if n > 1 {
		v.PrevURL = link(n - 1)
	}
	if n < pages {
		v.NextURL = link(n + 1)
	}
	return v
}

// fleetPage serves the fleet page: read from the coordination database at each request (three
// reads), so that what it says of owners is never older than the page.
func (f *fleetConsole) fleetPage(w http.ResponseWriter, r *http.Request, id Identity) {
	st, err := fleet.ReadStatus(r.Context(), f.fc, f.cfg.Fleet)
	if err != nil {
		f.root.failed(w, r, "read the fleet from its coordination database", err)
		return
	}
	cat, catErr := f.catalog(r.Context())
	n, _ := strconv.Atoi(r.URL.Query().Get("page"))
	v := f.buildFleetView(st, cat, strings.TrimSpace(r.URL.Query().Get("q")), n)
	var fl *flash
	if catErr != nil {
		when := "no tenant links to its console until it can be read"
		if cat != nil {
			when = "the links use the catalog read last"
		}
		fl = &flash{Text: fmt.Sprintf("Cannot read the fleet's catalog (%v): %s.", catErr, when)}
	}
	f.root.render(w, r, "fleet", "Fleet "+f.cfg.Fleet, "fleet", id, v, fl)
}
