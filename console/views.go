package console

import (
	"time"

	"github.com/outboxkit/outboxkit/store"
)

// The view models the templates render, filled from the store (store.Console) and the cache.

// Severity orders problems and colours them; every colour also has a word and a symbol.
type severity int

const (
	sevOK severity = iota
	sevWarn
	sevBad
)

type problem struct {
	Severity severity
	Subject  string // the thing: a consumer, a relay, a topic
	Text     string // one sentence a tired person reads once
	Link     string // where to fix it, relative to the console's prefix
	Action   string // the link's words
}

type overview struct {
	Problems        []problem
	Pending         int64
	PendingCapped   bool // Pending counted the oldest 100,000 rows only
	OldestPending   time.Duration
	PublishRate     float64 // rows a second, over the last minute of relay heartbeats
	OutboxDead      int64
	ConsumerDead    int64
	OldestDead      time.Duration
	Topics          []topicRow
	Relays          []relayRow
	Consumers       []consumerRow
	TopGroups       []groupRow
	Charts          *overviewCharts // the last hour; nil when the charts are off
	CountedAt       time.Time       // when the cached counts were read
	BacklogHeadRows int             // how many pending rows the per-topic figures read (the oldest)
}

type topicRow struct {
	Topic         string
	Pending       int64
	PendingCapped bool
	OldestPending time.Duration
	PublishRate   float64
	DeadLetters   int64
	Paused        *pause
}

type pause struct {
	By     string
	At     time.Time
	Reason string
	// AckedBy lists the relays whose heartbeat acknowledged the pause.
	AckedBy []string
}

type relayRow struct {
	Name        string
	Instance    string // host/pid
	LastPass    time.Duration
	LastPublish time.Duration
	Heartbeat   time.Duration
	CircuitOpen bool
	CircuitFor  time.Duration
	Paused      *pause
	Gone        bool // heartbeat older than 3 intervals
}

type consumerRow struct {
	Consumer      string
	Topics        string
	ProcessedRate float64 // a minute
	Waiting       int64   // broker backlog
	Unacked       int64
	HasUnacked    bool
	BrokerOldest  time.Duration
	HasLag        bool
	DeadLetters   int64
	OldestDead    time.Duration
	Parked        int64
}

// Side is where a dead letter waits: the outbox (the relay could not publish it) or a consumer.
type side struct {
	Outbox   bool
	Consumer string
}

func sideOf(name string) side {
	if name == store.SideOutbox {
		return side{Outbox: true}
	}
	return side{Consumer: name}
}

func (s side) String() string {
	if s.Outbox {
		return "outbox"
	}
	return s.Consumer
}

type groupRow struct {
	ID        string // hex of the failure group
	Side      side
	EventType string
	Pattern   string
	Example   string
	Count     int64
	Share     float64 // of the largest group on the page, for the bar
	FirstSeen time.Duration
	LastSeen  time.Duration
	Topics    string
}

// Filter is a dead-letter selection as the list page's form and the job records carry it.
type filter struct {
	Side         string // "" all, "outbox", or a consumer name
	Topic        string
	EventType    string
	PartitionKey string
	ErrorText    string
	Group        string
	Within       string // a preset: 15m, 1h, 6h, 24h, 7d
	From, Until  string // as typed, UTC: 2006-01-02 15:04
	Archived     bool
}

type chip struct {
	Label, Value, Remove string // Remove: the list URL without this filter
}

type letterRow struct {
	Ref          string // side:id, a selection box's value
	ID           int64
	Side         side
	MessageID    string
	Topic        string
	EventType    string
	PartitionKey string
	Error        string
	Attempts     int
	DeadFor      time.Duration
	At           time.Time
	PayloadSize  int
	Replayed     bool
	Archived     bool
	ReplayedAt   time.Time
	ArchivedAt   time.Time
}

type lettersPage struct {
	Filter     filter
	Chips      []chip
	Sides      []sideTab
	Groups     []groupRow
	GroupsNote string
	Letters    []letterRow
	Total      int64
	TotalCap   bool // more than the bounded count
	Searched   int  // rows an error-text search read before it stopped (bounded scan)
	NewerURL   string
	OlderURL   string
	Query      string // the filter as a query string, for links and forms
	EventTypes []string
	Withins    [][2]string
	MoreGroups int // groups beyond the ten shown
	Topics     []string
}

type sideTab struct {
	Label, URL string
	Count      int64
	Active     bool
}

type letterDetail struct {
	Letter        letterRow
	FullError     string
	Pattern       string
	GroupID       string
	GroupCount    int64
	CreatedAt     time.Time
	TraceID       string
	TraceURL      string
	OutboundKey   string
	Metadata      [][2]string
	PayloadJSON   string // pretty, "" when not JSON
	PayloadHex    string // when not UTF-8
	PayloadText   string
	PayloadHidden bool
	Truncated     bool
	History       []historyRow
}

type historyRow struct {
	At   time.Time
	What string
	Who  string
}

type job struct {
	ID          int64
	Kind        string // replay, archive
	State       string // queued, preparing, running, cancelling, cancelled, done, failed
	Chips       []chip
	Total       int64
	Done        int64
	Replayed    int64
	Skipped     int64 // already replayed or archived since the preview: a no-op
	Failed      int64
	Published   int64 // outbox jobs: of Replayed, rows the relay has published since
	HasPublish  bool
	Rate        int
	Started     time.Time
	Elapsed     time.Duration
	ETA         time.Duration
	By          string
	Owner       string // console instance running it
	LeaseOK     bool
	LastError   string
	Waiting     string // why it is not moving, when it is not
	KeysPending int64  // per-key order: keys whose earlier letter is still ahead in the job
}

type auditRow struct {
	ID       int64
	At       time.Time
	Who      string
	Role     string
	Action   string
	Chips    []chip
	Matched  int64
	Affected int64
	JobID    int64
	Result   string
	OK       bool
}

type preview struct {
	Filter      filter
	Chips       []chip
	Count       int64
	Breakdown   [][3]string // side, event type, count
	Keys        int64
	KeysBlocked int64 // keys with an earlier dead letter outside the selection
	AlreadyDone int64
	Rate        int
	Duration    time.Duration
	Sample      []letterRow
	Nonce       string
	Query       string
}
