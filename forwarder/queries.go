package forwarder

import (
	"embed"
	"strings"

	"github.com/outboxkit/outboxkit/internal/schema"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

// queries holds the forwarder's SQL, rendered once for the configured schema.
type queries struct {
	claim, markPublished, deletePublished, markFailed, prunePublished, replay, deadLetters, stats string
}

func loadQueries(name schema.Name) queries {
	raw := func(file string) string {
		b, err := sqlFiles.ReadFile("sql/" + file)
		if err != nil {
			panic("forwarder: embedded query " + file + " missing: " + err.Error())
		}
		return string(b)
	}
	filter := raw("dead_letter_filter.sql")
	read := func(file string) string {
		b, err := sqlFiles.ReadFile("sql/" + file)
		if err != nil {
			panic("forwarder: embedded query " + file + " missing: " + err.Error())
		}
		return name.Render(strings.ReplaceAll(string(b), "{{dead_letter_filter}}", filter))
	}
	return queries{
		claim:           read("claim.sql"),
		markPublished:   read("mark_published.sql"),
		deletePublished: read("delete_published.sql"),
		markFailed:      read("mark_failed.sql"),
		prunePublished:  read("prune_published.sql"),
		replay:          read("replay.sql"),
		deadLetters:     read("dead_letters.sql"),
		stats:           read("stats.sql"),
	}
}
