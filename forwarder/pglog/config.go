package pglog

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/forwarder"
)

// Mode is how writers put events where the relay reads them.
type Mode string

const (
	// ModeTable reads the rows writers insert into the outbox table, as for the polling relay: the
	// operator's tools, dead letters and a backfill after a lost slot keep working.
	ModeTable Mode = "table"
	// ModeWAL reads the logical decoding messages writers emit in their transactions instead of
	// rows (pgxstore.Config.WAL): nothing is written to a table, so the events of the log cannot
	// be backfilled, and a lost slot stops the relay (ErrSlotLost) unless SkipLostEvents. (The
	// outbox rows there are — dead letters replayed, events parked behind a dead letter — are
	// backfilled.) Postgres 14 or newer.
	ModeWAL Mode = "wal"
)

// Defaults for Config fields left at their zero value.
const (
	DefaultStandbyRetry   = 100 * time.Millisecond
	DefaultStatusInterval = time.Second
	DefaultFlushInterval  = time.Second
	DefaultFlushRows      = 1000
	DefaultWindow         = 10000
)

// Config configures a Relay. Zero-valued fields take the documented defaults.
type Config struct {
	// Forwarder publishes the events: its Publisher, Name (the relay group: it names the slot and
	// the publication), MaxInFlight, MaxAttempts, Backoff, ParkKeyOnDeadLetter, CircuitBackoff,
	// PublishTimeout (for each event), TopicMapping, Metrics, TracerProvider and Logger apply; its
	// BatchSize does not (there are no rounds). Here MaxInFlight bounds the events in flight at any
	// moment — each waiting for the broker's confirmation — and since a key has one at a time, the
	// keys in flight too: each event without a key counts as a key of its own. Its Store's schema
	// is the outbox's schema. Required.
	Forwarder *forwarder.Forwarder

	// Pool connects to the database holding the outbox: its connection settings also open the
	// replication connection, directly to the server (a pooler in transaction mode cannot carry
	// one). Required.
	Pool *pgxpool.Pool

	// Mode is the writers' mode. Default ModeTable.
	Mode Mode

	// StandbyRetry is how often a standby asks for the slot while another relay reads it: the
	// bound on a takeover after the active relay's connection closes. Default 100ms.
	StandbyRetry time.Duration

	// StatusInterval is the most time between two standby status updates to the server, which
	// carry the confirmed position. Default 1s.
	StatusInterval time.Duration

	// FlushInterval and FlushRows bound how long, and for how many published rows, the removal of
	// published outbox rows (and the checkpoint with it) waits, in one DELETE. Defaults 1s and 1000.
	//
	// With a transactional publisher (the Kafka backend with a transactional_id) they are the
	// transaction's bounds too: a transaction commits at each checkpoint, when FlushInterval has
	// passed or it holds FlushRows rows, and a read_committed consumer sees an event only then.
	// So FlushInterval is the most an event waits, once published, to become visible (plus the
	// commit's round trip), and a shorter one costs more transactions per second: each commit
	// writes a progress record and waits for the coordinator, and publishing pauses for it while
	// the rows in flight finish. The default gives at most one transaction per second when events
	// trickle, and one per 1000 events under load.
	FlushInterval time.Duration
	FlushRows     int

	// Window is the most events (and transaction ends) read ahead of the oldest unpublished one. A
	// key that backs off, or an event a pause holds, holds the confirmed position; once Window
	// events are held (those that flowed past them make room), the reading waits. Default 10000.
	Window int

	// SkipLostEvents lets a relay in ModeWAL whose slot is lost make a new one and go on, without
	// the events of the log the lost slot held (they are not published); the outbox rows waiting
	// in the table are read by the new slot's backfill. Default false: Run returns ErrSlotLost.
	SkipLostEvents bool

	// SlotName and PublicationName override the names derived from the schema and the
	// forwarder's Name ("outboxkit_<schema>_<name>", lowercase, at most 63 bytes).
	SlotName        string
	PublicationName string
}
