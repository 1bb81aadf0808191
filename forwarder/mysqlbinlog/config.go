package mysqlbinlog

import (
	"time"

	"github.com/outboxkit/outboxkit/forwarder"
)

// Defaults for Config fields left at their zero value.
const (
	DefaultFlushInterval = time.Second
	DefaultFlushRows     = 1000
	DefaultWindow        = 10000
	// DefaultHeartbeat is how often the server sends a heartbeat on an idle stream: the relay
	// takes a stream silent for three of them as lost.
	DefaultHeartbeat = 5 * time.Second
)

// Config configures a Relay. Zero-valued fields take the documented defaults.
type Config struct {
	// Forwarder publishes the events: its Publisher, Name (the relay group: it names the
	// checkpoint and the lock), BatchSize (the most rows of one publish round), MaxInFlight (the
	// keys published at once in a round), MaxAttempts, Backoff, CircuitBackoff, PublishTimeout,
	// TopicMapping, Metrics, TracerProvider and Logger apply. Its Store is the outbox's: a MySQL
	// store (mysqlstore), whose database holds the outbox and the relay's checkpoint table. Its
	// ParkKeyOnDeadLetter is not supported (New refuses it), nor a transactional Publisher (Run
	// refuses it). Required.
	Forwarder *forwarder.Forwarder

	// URL reaches the server holding the outbox, mysql://user:pass@host:3306/db: the relay reads
	// the binary log through it (directly from the server: a proxy that cannot carry the
	// replication protocol will not do) and runs its own statements on it — the checkpoint, the
	// checks, the first start's reading of the table. The user needs REPLICATION SLAVE and, on
	// MariaDB, BINLOG MONITOR (REPLICATION CLIENT on MySQL), besides SELECT, UPDATE and DELETE on
	// the outbox and CREATE, SELECT, INSERT and UPDATE on the relay's table in the outbox's
	// database. Required.
	URL string

	// ServerID is the server_id the relay gives the server when it asks for the binary log, as
	// a replica does: unique among the server's replicas and relays, and not the server's own.
	// Default: derived from the outbox's database and the forwarder's Name (a number from
	// 2^31 up), so that relay groups differ.
	ServerID uint32

	// FilePosition tracks the relay's progress by binary log file and position even where the
	// server keeps GTIDs. Default false: GTIDs where the server has them — MariaDB always,
	// MySQL with gtid_mode = ON — and file and position on a MySQL server without them.
	FilePosition bool

	// FlushInterval and FlushRows bound how long, and for how many published rows, the removal
	// of published outbox rows — and the checkpoint recorded in the same transaction — waits.
	// Defaults 1s and 1000.
	FlushInterval time.Duration
	FlushRows     int

	// Window is the most rows (and transaction ends) held in memory ahead of the oldest one not
	// yet published. A row that backs off, or one a pause holds, holds the checkpoint there; once
	// Window items are held the reading of the log waits. Default 10000.
	Window int

	// Heartbeat is how often the server sends a heartbeat on an idle stream; a stream silent for
	// three of them is taken as lost and read again from the last checkpoint. Default 5s.
	Heartbeat time.Duration
}
