package mysqlbinlog

import (
	"embed"
	"strings"
)

//go:embed sql/*.sql
var files embed.FS

// statements are the relay's SQL, rendered for the outbox's database.
type statements struct {
	serverSettings, columns                      string
	createCheckpoints, readCheckpoint, writeCkpt string
	removePublished                              string // with {{seqs}} to expand
	deadLetter, recordFailure, backingOff        string
	backfill                                     string
	status                                       string
}

func newStatements(database string) statements {
	read := func(name string) string {
		b, err := files.ReadFile("sql/" + name)
		if err != nil {
			panic(err)
		}
		return strings.ReplaceAll(string(b), "{{schema}}", "`"+database+"`")
	}
	return statements{
		serverSettings: read("server_settings.sql"), columns: read("columns.sql"),
		createCheckpoints: read("create_checkpoints.sql"), readCheckpoint: read("read_checkpoint.sql"),
		writeCkpt: read("write_checkpoint.sql"), removePublished: read("remove_published.sql"),
		deadLetter: read("dead_letter.sql"), recordFailure: read("record_failure.sql"),
		backingOff: read("backing_off.sql"), backfill: read("backfill.sql"),
		status: read("status.sql"),
	}
}

// placeholders is n comma-separated placeholders, for an IN list.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}
