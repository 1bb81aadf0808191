package mysqlbinlog

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/outboxkit/outboxkit/store"
)

// The outbox's columns a row image must carry for the relay to publish the row (binlog_row_image
// = FULL carries them all).
var rowColumns = []string{"seq", "uuid", "topic", "partition_key", "payload", "metadata", "created_at", "attempts", "published_at", "dead_lettered_at"}

// layout is how MySQL writes a DATETIME(6) in a row image and in a result, in UTC.
const layout = "2006-01-02 15:04:05.999999"

// columnMap is where each of rowColumns is in the outbox's row images.
type columnMap struct {
	at    map[string]int
	count int // the columns of the table the map was made for
}

// mapColumns maps names (the table's columns in their order) to their places.
func mapColumns(names []string) (columnMap, error) {
	m := columnMap{at: map[string]int{}, count: len(names)}
	for i, n := range names {
		m.at[strings.ToLower(n)] = i
	}
	var missing []string
	for _, c := range rowColumns {
		if _, ok := m.at[c]; !ok {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return m, fmt.Errorf("the outbox has no column %s: is it outboxkit's outbox, migrated (mysqlstore's Migrate)?", strings.Join(missing, ", "))
	}
	return m, nil
}

// readColumns reads the outbox's columns in their order from the server's catalog, which a row
// image without names (binlog_row_metadata = MINIMAL, the default) follows.
func (r *Relay) readColumns(ctx context.Context, db *sql.DB) ([]string, error) {
	rows, err := db.QueryContext(ctx, r.sql.columns, r.database)
	if err != nil {
		return nil, fmt.Errorf("read the outbox's columns: %w", err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, fmt.Errorf("read the outbox's columns: %w", err)
		}
		names = append(names, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the outbox's columns: %w", err)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("the database %s has no outbox table: migrate it (mysqlstore's Migrate)", r.database)
	}
	return names, nil
}

// outboxRow is a row image of the outbox, decoded.
type outboxRow struct {
	row          store.OutboxRow
	published    bool // published_at set
	deadLettered bool // dead_lettered_at set
}

// decodeImage decodes one row image whose columns present are those of bitmap (nil: all).
func decodeImage(m columnMap, image []any, bitmap []byte) (outboxRow, error) {
	var out outboxRow
	for _, c := range rowColumns {
		i := m.at[c]
		if i >= len(image) || (bitmap != nil && bitmap[i/8]&(1<<(i%8)) == 0) {
			return out, errMissingColumn(c)
		}
	}
	v := func(c string) any { return image[m.at[c]] }
	var err error
	if out.row.Seq, err = toInt64(v("seq")); err != nil {
		return out, fmt.Errorf("column seq: %w", err)
	}
	out.row.UUID = strings.Clone(toString(v("uuid")))
	out.row.Topic = strings.Clone(toString(v("topic")))
	out.row.PartitionKey = strings.Clone(toString(v("partition_key")))
	out.row.Payload = bytes.Clone(toBytes(v("payload")))
	if out.row.Payload == nil {
		out.row.Payload = []byte{}
	}
	out.row.Metadata = bytes.Clone(toBytes(v("metadata")))
	if out.row.CreatedAt, err = toTime(v("created_at")); err != nil {
		return out, fmt.Errorf("column created_at: %w", err)
	}
	attempts, err := toInt64(v("attempts"))
	if err != nil {
		return out, fmt.Errorf("column attempts: %w", err)
	}
	out.row.Attempts = int(attempts)
	out.published = v("published_at") != nil
	out.deadLettered = v("dead_lettered_at") != nil
	return out, nil
}

// errMissingColumn is a row image without a column the relay needs: written by a session with
// binlog_row_image other than FULL.
type errMissingColumn string

func (e errMissingColumn) Error() string {
	return fmt.Sprintf("a row event of the outbox lacks its column %s: a writer's session logs row images other than FULL "+
		"(SET SESSION binlog_row_image, or a global setting changed after it connected): "+
		"SET GLOBAL binlog_row_image = 'FULL', set it in the option file, and let the writers reconnect; "+
		"the rows of such events stay in the outbox, unpublished, until a relay reads them", string(e))
}

// isOutbox reports whether a table map names the relay's outbox.
func (r *Relay) isOutbox(t *replication.TableMapEvent) bool {
	return t != nil && string(t.Table) == "outbox" && string(t.Schema) == r.database
}

func toInt64(v any) (int64, error) {
	switch n := v.(type) {
	case int8:
		return int64(n), nil
	case int16:
		return int64(n), nil
	case int32:
		return int64(n), nil
	case int64:
		return n, nil
	case int:
		return int64(n), nil
	case uint8:
		return int64(n), nil
	case uint16:
		return int64(n), nil
	case uint32:
		return int64(n), nil
	case uint64:
		return int64(n), nil
	default:
		return 0, fmt.Errorf("not an integer: %T %v", v, v)
	}
}

func toString(v any) string {
	switch s := v.(type) {
	case string:
		return s
	case []byte:
		return string(s)
	case nil:
		return ""
	default:
		return fmt.Sprint(s)
	}
}

func toBytes(v any) []byte {
	switch b := v.(type) {
	case []byte:
		return b
	case string:
		return []byte(b)
	default:
		return nil
	}
}

func toTime(v any) (time.Time, error) {
	switch t := v.(type) {
	case time.Time:
		return t.UTC(), nil
	case string:
		return time.ParseInLocation(layout, t, time.UTC)
	case []byte:
		return time.ParseInLocation(layout, string(t), time.UTC)
	default:
		return time.Time{}, fmt.Errorf("not a time: %T %v", v, v)
	}
}
