package pgsql

import (
	"embed"
	"strings"
)

//go:embed logrelay/*.sql
var logRelayFiles embed.FS

// LogRelay is the log relay's statements (forwarder/pglog), rendered for one schema: each field is
// the file of logrelay/ named after it in snake case, whose comment lists its parameters. Its
// fields are read-only once made, so one LogRelay serves any number of goroutines.
type LogRelay struct {
	ServerSettings  string
	Publication     string
	ReplicationSlot string
	FreeSlots       string
	CurrentDatabase string
	ReadCheckpoint  string
	WriteCheckpoint string
	Slots           string
	Backfill        string
	ParkedKeys      string
	ReadBack        string
	DeadLetterRow   string
	DeadLetterEvent string
	ParkEvent       string
	DeadLetterSeq   string
	Checkpoint      string
	RemovePublished string
	RunningXids     string

	createPublication string
	setSnapshot       string
}

// NewLogRelay renders the log relay's statements for the outbox in schema, a name the dialect
// validated. It panics if a file is missing from the build, which no test run lets pass.
func NewLogRelay(schema string) *LogRelay {
	columns := strings.TrimSpace(logRelayFile("event_columns.sql"))
	read := func(file string) string {
		return strings.ReplaceAll(Render(schema, logRelayFile(file)), "{{event_columns}}", columns)
	}
	return &LogRelay{
		ServerSettings:    read("server_settings.sql"),
		Publication:       read("publication.sql"),
		ReplicationSlot:   read("replication_slot.sql"),
		FreeSlots:         read("free_slots.sql"),
		CurrentDatabase:   read("current_database.sql"),
		ReadCheckpoint:    read("read_checkpoint.sql"),
		WriteCheckpoint:   read("write_checkpoint.sql"),
		Slots:             read("slots.sql"),
		Backfill:          read("backfill.sql"),
		ParkedKeys:        read("parked_keys.sql"),
		ReadBack:          read("read_back.sql"),
		DeadLetterRow:     read("dead_letter_row.sql"),
		DeadLetterEvent:   read("dead_letter_event.sql"),
		ParkEvent:         read("park_event.sql"),
		DeadLetterSeq:     read("dead_letter_seq.sql"),
		Checkpoint:        read("checkpoint.sql"),
		RemovePublished:   read("remove_published.sql"),
		RunningXids:       read("running_xids.sql"),
		createPublication: read("create_publication.sql"),
		setSnapshot:       read("set_snapshot.sql"),
	}
}

// CreatePublication is the statement that creates the publication named publication (any name:
// it is quoted) of the outbox's INSERTs.
func (q *LogRelay) CreatePublication(publication string) string {
	return strings.ReplaceAll(q.createPublication, "{{publication}}", Ident(publication))
}

// SetSnapshot is the statement that makes a repeatable-read transaction read as of snapshot, a name
// the server exported (it is quoted as a literal: SET takes no parameters).
func (q *LogRelay) SetSnapshot(snapshot string) string {
	return strings.ReplaceAll(q.setSnapshot, "{{snapshot}}", "'"+strings.ReplaceAll(snapshot, "'", "''")+"'")
}

func logRelayFile(name string) string {
	b, err := logRelayFiles.ReadFile("logrelay/" + name)
	if err != nil {
		panic("pgsql: embedded statement " + name + " missing: " + err.Error())
	}
	return string(b)
}
