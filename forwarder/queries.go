package forwarder

import (
	"embed"

	"github.com/outboxkit/outboxkit/internal/schema"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

// queries holds the forwarder's SQL, rendered once for the configured schema.
type queries struct {
	claim, markPublished, deletePublished, markFailed, prunePublished, replay, stats string
}

func loadQueries(name schema.Name) queries {
	read := func(file string) string {
		b, err := sqlFiles.ReadFile("sql/" + file)
		if err != nil {
			panic("forwarder: embedded query " + file + " missing: " + err.Error())
		}
		return name.Render(string(b))
	}
	return queries{
		claim:           read("claim.sql"),
		markPublished:   read("mark_published.sql"),
		deletePublished: read("delete_published.sql"),
		markFailed:      read("mark_failed.sql"),
		prunePublished:  read("prune_published.sql"),
		replay:          read("replay.sql"),
		stats:           read("stats.sql"),
	}
}
