package store

import (
	"context"
	"errors"
	"time"
)

// SideOutbox names the outbox's dead letters where a consumer's name would stand (LetterQuery,
// GroupCount, DeadLetter.Side). A consumer cannot be named "outbox".
const SideOutbox = "outbox"

// SideConsumers is a job's side for consumers' dead letters (LetterQuery.Side narrows it to one).
const SideConsumers = "consumers"

// Pause scopes.
const (
	PauseTopic = "topic" // no relay publishes the topic
	PauseRelay = "relay" // relays of that name publish nothing
)

// Pause stops relays from publishing a topic, or stops every relay of a name. Paused rows wait,
// pending: nothing is counted against them, and they go out in order once resumed.
type Pause struct {
	Scope  string // PauseTopic or PauseRelay
	Name   string // the topic, or the relay's name
	By     string // who paused it
	Reason string
	At     time.Time
}

// RelayBeat is what a relay says about itself at each heartbeat.
type RelayBeat struct {
	// Owner is unique per relay instance; Name is its configured name (several may share it).
	Owner, Name, Host string
	PID               int
	Started, At       time.Time // when the relay started; when this heartbeat was sent
	LastPass          time.Time // zero: none yet
	LastPublish       time.Time
	// CircuitOpenSince is when the broker stopped answering; zero while it answers.
	CircuitOpenSince time.Time
	// Blocked is why the relay cannot publish (the broker's error), "" when it can.
	Blocked string
	// PublishedTotal and PublishedByTopic count the rows the relay published since it started:
	// the console reads rates from two heartbeats.
	PublishedTotal   int64
	PublishedByTopic map[string]int64
	// PausesSeen is when the relay last read the pauses: a pause set before it is honoured.
	PausesSeen time.Time
}

// RelayControl is what a relay reads and reports beside the outbox: the pauses, and its heartbeat.
// Every driver in this module implements it; forwarder.Forwarder uses it when its store does.
type RelayControl interface {
	// Pauses lists the pauses in force.
	Pauses(ctx context.Context) ([]Pause, error)
	// RelayHeartbeat records b, and forgets relays whose last heartbeat is a day old.
	RelayHeartbeat(ctx context.Context, b RelayBeat) error
}

// LetterQuery selects dead letters for the console: set fields narrow the selection (AND).
type LetterQuery struct {
	// Side is SideOutbox, a consumer's name, SideConsumers (every consumer), or "" (everywhere:
	// the outbox's and every consumer's).
	Side string `json:"side,omitempty"`
	// IDs selects letters by id (outbox seq, or consumer letter id); with one Side only.
	IDs           []int64   `json:"ids,omitempty"`
	Topic         string    `json:"topic,omitempty"`
	EventType     string    `json:"event_type,omitempty"`
	PartitionKey  string    `json:"partition_key,omitempty"`
	ErrorContains string    `json:"error_contains,omitempty"`
	FailureGroup  int64     `json:"failure_group,omitempty"`
	ByGroup       bool      `json:"by_group,omitempty"` // FailureGroup is set (0 is a group's id too: not grouped yet)
	From          time.Time `json:"from,omitzero"`      // dead-lettered at or after
	Until         time.Time `json:"until,omitzero"`     // dead-lettered before
	// Archived selects archived letters instead of waiting ones.
	Archived bool `json:"archived,omitempty"`

	// Listing only (ignored by counts, groups and jobs).
	Before    LetterCursor `json:"-"` // rows strictly older than it; zero: from the newest
	Limit     int          `json:"-"` // default 50
	ScanLimit int          `json:"-"` // see ListDeadLetters; 0: no bound
}

// Unindexed reports whether q filters by something no index of the console serves: topic, event
// type or error text. Such a selection is read by a bounded scan.
func (q LetterQuery) Unindexed() bool {
	return q.Topic != "" || q.EventType != "" || q.ErrorContains != ""
}

// Consumer is the one consumer q narrows to, "" for none.
func (q LetterQuery) Consumer() string {
	if q.Side == "" || q.Side == SideOutbox || q.Side == SideConsumers {
		return ""
	}
	return q.Side
}

// LetterCursor is a position in the newest-first order of dead letters: (dead-lettered at, side,
// id), consumers' letters before the outbox's at the same instant.
type LetterCursor struct {
	At     time.Time
	Outbox bool
	ID     int64
}

// IsZero reports whether c is the start.
func (c LetterCursor) IsZero() bool { return c.At.IsZero() && c.ID == 0 }

// LetterPage is one page of dead letters, newest first. Letters carry no payload.
type LetterPage struct {
	Letters []DeadLetter
	// Next is the cursor of the following page; zero when there is none.
	Next LetterCursor
	// Scanned is how many letters a bounded scan read, and ScanStopped whether it stopped at
	// ScanLimit before the selection's end (Next then continues the scan).
	Scanned     int
	ScanStopped bool
}

// GroupCount is how many waiting letters of one side share a failure group.
type GroupCount struct {
	Side         string // SideOutbox or the consumer
	FailureGroup int64
	Count        int64
	First, Last  time.Time // oldest and newest dead-lettered at
}

// SideTotal is what waits on one side (outbox or a consumer), or on one outbox topic.
type SideTotal struct {
	Side   string // SideOutbox or the consumer
	Topic  string // the outbox's per-topic totals; "" otherwise
	Count  int64
	Oldest time.Time // oldest dead-lettered at; zero when none
}

// TopicBacklog is what the oldest pending rows say about one topic.
type TopicBacklog struct {
	Topic         string
	Pending       int64     // among the rows read: exact unless the read was capped
	OldestCreated time.Time // the topic's oldest pending row's created_at (exact: the read goes oldest first)
}

// ConsumerCount is how many messages a consumer processed in a window.
type ConsumerCount struct {
	Consumer string
	Count    int64
}

// Job states: queued → running ⇄ waiting → done, cancelled or failed; cancelling between a
// request to cancel and the runner seeing it.
const (
	JobQueued     = "queued"
	JobRunning    = "running"
	JobWaiting    = "waiting" // held back (backpressure, an unreachable broker), with a reason
	JobCancelling = "cancelling"
	JobDone       = "done"
	JobCancelled  = "cancelled"
	JobFailed     = "failed"
)

// Job kinds.
const (
	JobReplay  = "replay"
	JobArchive = "archive"
)

// NewJob asks for a job: replay or archive every letter of Filter that waits now.
type NewJob struct {
	Kind   string      // JobReplay or JobArchive
	Filter LetterQuery // Side SideOutbox, or a consumer's name, or SideConsumers
	// RequestKey makes creation idempotent: a second call with the same key returns the job
	// the first created (a form sent twice).
	RequestKey string
	Rate       int   // letters a second
	Expected   int64 // what the person was shown (the preview's count), for the record
	By         string
	Now        time.Time
}

// Job is a replay or archive of many letters, run by a console's job runner at Rate, in each
// key's order, resumable by any console after a crash.
type Job struct {
	ID     int64
	Kind   string
	Side   string // SideOutbox or SideConsumers
	Filter LetterQuery
	// The selection is frozen when the job is created: letters dead-lettered later are not in it.
	SnapshotMaxID int64
	SnapshotAt    time.Time
	Rate          int
	Expected      int64
	Total         int64 // letters the frozen selection held when the job was created
	State         string
	// The cursor, in the job's order (outbox: seq; consumers: source seq, id).
	CursorSeq, CursorID int64
	// Applied letters were replayed (or archived); Skipped were no longer waiting when the job
	// reached them (replayed or archived meanwhile): a no-op. Failed could not be sent.
	Applied, Skipped, Failed int64
	Owner                    string // the console running it
	LeaseUntil               time.Time
	LeaseToken               int64
	CreatedBy                string
	CreatedAt                time.Time
	StartedAt, FinishedAt    time.Time
	CancelBy                 string
	CancelAt                 time.Time
	Waiting                  string // why the job is not moving, while it is not
	LastError                string
}

// Open reports whether the job still has work or a runner may claim it.
func (j Job) Open() bool {
	switch j.State {
	case JobQueued, JobRunning, JobWaiting, JobCancelling:
		return true
	}
	return false
}

// JobLease is a runner's hold on a job: every write of the job checks it is still the holder.
type JobLease struct {
	ID    int64
	Owner string
	Token int64
}

// JobStep is what one batch of a job did.
type JobStep struct {
	Applied, Skipped int64
	Done             bool // the selection is exhausted
}

// AuditEntry is one action taken, or refused, in the console.
type AuditEntry struct {
	ID       int64
	At       time.Time
	Actor    string
	Role     string
	Action   string // replay, archive, pause, resume, cancel, …
	Filter   string // the selection, as the console shows it
	Matched  int64  // what the person was shown before acting
	Affected int64  // what the action changed
	JobID    int64
	Result   string
	OK       bool // false: refused or failed
}

// Console is what package console asks of a database beyond Store. Every driver in this module
// implements it; storetest proves it. Lists are keyset-paged and their scans bounded, so a page
// costs the same at a million letters as at ten.
type Console interface {
	RelayControl

	// SchemaVersion reads the version outboxkit's tables are at (0 when there are none) and the
	// newest version this build knows.
	SchemaVersion(ctx context.Context) (current, newest int, err error)

	// ListDeadLetters reads one page of q, newest first, without payloads. A selection by a
	// filter no index serves (LetterQuery.Unindexed) reads at most q.ScanLimit letters from
	// q.Before and says where it stopped.
	ListDeadLetters(ctx context.Context, q LetterQuery) (LetterPage, error)
	// CountDeadLetters counts q's letters up to limit (negative: no bound); capped is true when
	// there are more.
	CountDeadLetters(ctx context.Context, q LetterQuery, limit int) (n int64, capped bool, err error)
	// GroupCounts counts q's waiting letters per side and failure group. Filters no index serves
	// are applied to the scanLimit newest letters only (0: all).
	GroupCounts(ctx context.Context, q LetterQuery, scanLimit int) ([]GroupCount, error)
	// GroupExample returns a letter of side's failure group, waiting or not: the pattern is a
	// function of its error (FailureGroupOf). ErrNoLetter when there is none.
	GroupExample(ctx context.Context, side string, group int64) (DeadLetter, error)
	// DeadLetterTotals reads what waits per side, and on the outbox per topic.
	DeadLetterTotals(ctx context.Context) ([]SideTotal, error)
	// DeadLetter reads one letter with at most payloadMax bytes of its payload (PayloadSize says
	// how long it is); ErrNoLetter when there is none.
	DeadLetter(ctx context.Context, side string, id int64, payloadMax int) (DeadLetter, error)
	// DeadLetterPayload reads a letter's whole payload.
	DeadLetterPayload(ctx context.Context, side string, id int64) ([]byte, error)
	// Regroup fills the failure group, event type, partition key and source seq of at most batch
	// letters stored without them, and returns how many it filled.
	Regroup(ctx context.Context, batch int) (int, error)

	// TopicBacklog reads the oldest headRows pending outbox rows and groups them by topic; capped
	// is true when there were more.
	TopicBacklog(ctx context.Context, headRows int) (topics []TopicBacklog, capped bool, err error)
	// ProcessedSince counts, per consumer, the inbox rows processed at or after since, reading at
	// most capRows.
	ProcessedSince(ctx context.Context, since time.Time, capRows int) ([]ConsumerCount, error)
	// ParkedCounts counts the order guard's parked messages per consumer.
	ParkedCounts(ctx context.Context) (map[string]int64, error)
	// Relays reads the relays' last heartbeats.
	Relays(ctx context.Context) ([]RelayBeat, error)
	// SetPause pauses; false when it was paused already (the first pause stays).
	SetPause(ctx context.Context, p Pause) (bool, error)
	// ClearPause resumes; false when it was not paused.
	ClearPause(ctx context.Context, scope, name string) (bool, error)

	// CreateJob records a job and its frozen selection; created is false when a job with the same
	// RequestKey exists (it is returned).
	CreateJob(ctx context.Context, j NewJob) (job Job, created bool, err error)
	// Job reads a job; ErrNoJob when there is none.
	Job(ctx context.Context, id int64) (Job, error)
	// Jobs lists jobs newest first, those with an id below before (0: from the newest).
	Jobs(ctx context.Context, before int64, limit int) ([]Job, error)
	// ClaimJob takes the oldest open job whose lease has run out for owner until now+lease.
	ClaimJob(ctx context.Context, owner string, now time.Time, lease time.Duration) (Job, bool, error)
	// TakeJob is ClaimJob for one job: the console that created a small job runs it at once.
	TakeJob(ctx context.Context, id int64, owner string, now time.Time, lease time.Duration) (Job, bool, error)
	// RenewJob extends the lease and records why the job waits ("" when it moves); ErrLeaseLost
	// when another runner took it. It returns the job as stored (a cancel request shows there).
	RenewJob(ctx context.Context, l JobLease, until time.Time, waiting string) (Job, error)
	// StepOutboxJob replays or archives the next at most n letters of an outbox job, in seq
	// order, and moves its cursor, in one transaction fenced by the lease.
	StepOutboxJob(ctx context.Context, l JobLease, n int, now time.Time) (JobStep, error)
	// NextConsumerLetters reads, payloads included, the next at most n waiting letters of a
	// consumers' job after its cursor, in (source seq, id) order.
	NextConsumerLetters(ctx context.Context, l JobLease, n int) ([]DeadLetter, error)
	// ResetDeliveries forgets the delivery counts of letters before they are sent again.
	ResetLetterDeliveries(ctx context.Context, letters []DeadLetter) error
	// CommitConsumerLetters marks sent letters replayed (or archived, by the job's kind) where they
	// still wait, counts them and the failed ones (left waiting), and moves the cursor past both,
	// in one transaction fenced by the lease.
	CommitConsumerLetters(ctx context.Context, l JobLease, sent, failed []DeadLetter, now time.Time) (JobStep, error)
	// FinishJob ends a job in state (done, cancelled, failed), fenced by the lease.
	FinishJob(ctx context.Context, l JobLease, state, lastError string, now time.Time) error
	// RequestCancel asks the job's runner to stop it; false when it had ended already.
	RequestCancel(ctx context.Context, id int64, by string, now time.Time) (bool, error)

	// Audit records an action.
	Audit(ctx context.Context, e AuditEntry) error
	// AuditLog lists actions newest first, those with an id below before (0: from the newest).
	AuditLog(ctx context.Context, before int64, limit int) ([]AuditEntry, error)
}

// ErrNoLetter means there is no dead letter with that side and id.
var ErrNoLetter = errors.New("no such dead letter")

// ErrNoJob means there is no job with that id.
var ErrNoJob = errors.New("no such job")

// ErrLeaseLost means another runner took the job (this one stalled past its lease); nothing was written.
var ErrLeaseLost = errors.New("the job's lease was taken by another console: this runner stops")

// ConsoleOf returns the console's view of s: s itself, or the driver under a DB that Open
// returned. ok is false for a store whose driver does not implement Console.
func ConsoleOf(s Store) (Console, bool) {
	if d, ok := s.(*DB); ok {
		s = d.Driver
	}
	c, ok := s.(Console)
	return c, ok
}

// RelayControlOf is ConsoleOf for RelayControl, which a relay uses.
func RelayControlOf(s Store) (RelayControl, bool) {
	if d, ok := s.(*DB); ok {
		s = d.Driver
	}
	c, ok := s.(RelayControl)
	return c, ok
}
