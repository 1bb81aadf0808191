package pipeline

import (
	stdsql "database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"unicode/utf8"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/internal/schema"
	"github.com/outboxkit/outboxkit/internal/tracing"
)

// maxMessagesPerPublish keeps one INSERT under Postgres's 65,535 bind parameters (five per row).
const maxMessagesPerPublish = 65535 / 5

// maxFieldBytes bounds the topic, UUID and partition key. Brokers limit them far below this
// (AMQP short strings are 255 bytes); the bound catches a payload passed as a key by mistake.
const maxFieldBytes = 255

// SchemaAdapter is a watermill-sql v4 SchemaAdapter that writes messages into outboxkit's outbox
// table. Teams that already build watermill-sql publishers can plug it in directly:
//
//	pub, err := sql.NewPublisher(sql.TxFromStdSQL(tx), sql.PublisherConfig{
//		SchemaAdapter: pipeline.SchemaAdapter{},
//	}, logger)
//
// Every topic goes into the one outbox table; the topic is a column. The insert of a Publish call
// is one statement, and unless DisableNotify is set the same statement calls pg_notify, which
// Postgres delivers when the transaction commits and which wakes the forwarders at once.
//
// Only InsertQuery is supported: the outbox is read by the forwarder, not by a watermill-sql
// subscriber, and its tables are created by Migrate, not by AutoInitializeSchema.
type SchemaAdapter struct {
	// Schema is the Postgres schema holding the outbox table. Default "outboxkit".
	Schema string

	// DisableNotify leaves out the pg_notify call. Relays then find new rows at their next poll.
	// Default false. NOTIFY takes a database-wide lock at commit, which serialises the commits of
	// notifying transactions; set this where write throughput matters more than relay latency.
	DisableNotify bool
}

// InvalidMessageError says why a message cannot be stored in the outbox. Nothing is written
// when Publish returns it.
type InvalidMessageError struct {
	Index  int    // position of the message in the Publish call
	UUID   string // the message's UUID, possibly empty
	Reason string
}

func (e *InvalidMessageError) Error() string {
	return fmt.Sprintf("outbox publish: message %d (uuid %q): %s", e.Index, e.UUID, e.Reason)
}

// InsertQuery implements watermill-sql's SchemaAdapter.
func (a SchemaAdapter) InsertQuery(params wsql.InsertQueryParams) (wsql.Query, error) {
	name, err := schema.Parse(a.Schema)
	if err != nil {
		return wsql.Query{}, err
	}
	if err := validateTopic(params.Topic); err != nil {
		return wsql.Query{}, err
	}
	if len(params.Msgs) == 0 {
		return wsql.Query{}, errors.New("outbox publish: no messages given")
	}
	if len(params.Msgs) > maxMessagesPerPublish {
		return wsql.Query{}, fmt.Errorf("outbox publish: %d messages in one call; split them into calls of at most %d",
			len(params.Msgs), maxMessagesPerPublish)
	}

	var q strings.Builder
	args := make([]any, 0, len(params.Msgs)*5+1)
	if !a.DisableNotify {
		q.WriteString("WITH inserted AS (\n")
	}
	fmt.Fprintf(&q, "INSERT INTO %s.outbox (uuid, topic, partition_key, payload, metadata) VALUES ", name.Ident())
	for i, msg := range params.Msgs {
		row, err := outboxRow(i, params.Topic, msg)
		if err != nil {
			return wsql.Query{}, err
		}
		if i > 0 {
			q.WriteString(", ")
		}
		n := len(args)
		fmt.Fprintf(&q, "($%d::text, $%d::text, $%d::text, $%d::bytea, $%d::jsonb)", n+1, n+2, n+3, n+4, n+5)
		args = append(args, row...)
	}
	if !a.DisableNotify {
		fmt.Fprintf(&q, "\n)\nSELECT pg_notify($%d, '')", len(args)+1)
		args = append(args, name.NotifyChannel())
	}
	return wsql.Query{Query: q.String(), Args: args}, nil
}

func outboxRow(i int, topic string, msg *message.Message) ([]any, error) {
	if msg == nil {
		return nil, &InvalidMessageError{Index: i, Reason: "message is nil"}
	}
	invalid := func(format string, a ...any) error {
		return &InvalidMessageError{Index: i, UUID: msg.UUID, Reason: fmt.Sprintf(format, a...)}
	}
	if msg.UUID == "" {
		return nil, invalid("empty UUID: give every message a unique id (pipeline.NewEvent does), " +
			"it is the identity consumers deduplicate on")
	}
	if reason := checkText(msg.UUID); reason != "" {
		return nil, invalid("UUID %s", reason)
	}
	if len(msg.UUID) > maxFieldBytes {
		return nil, invalid("UUID is %d bytes; at most %d", len(msg.UUID), maxFieldBytes)
	}
	for k, v := range msg.Metadata {
		if k == "" {
			return nil, invalid("metadata has an empty key")
		}
		if reason := checkText(k); reason != "" {
			return nil, invalid("metadata key %q %s", k, reason)
		}
		if reason := checkText(v); reason != "" {
			return nil, invalid("metadata %q value %s", k, reason)
		}
	}
	var key any
	if k := outboxkit.PartitionKey(msg); k != "" {
		if len(k) > maxFieldBytes {
			return nil, invalid("partition key is %d bytes; at most %d", len(k), maxFieldBytes)
		}
		key = k
	}
	md := msg.Metadata
	if !tracing.Has(md) && trace.SpanContextFromContext(msg.Context()).IsValid() {
		// The writer's trace context travels with the row (W3C traceparent/tracestate), so the
		// relay can link its publish to the request and the consumers can continue its trace.
		// Written into a copy: the caller's message stays as it was given.
		withTrace := make(message.Metadata, len(md)+2)
		maps.Copy(withTrace, md)
		tracing.Inject(msg.Context(), withTrace)
		md = withTrace
	}
	metadata, err := json.Marshal(md)
	if err != nil {
		return nil, invalid("metadata cannot be encoded as JSON: %v", err)
	}
	if md == nil {
		metadata = []byte("{}")
	}
	payload := []byte(msg.Payload)
	if payload == nil {
		payload = []byte{} // the column is NOT NULL; an empty payload is still a payload
	}
	return []any{msg.UUID, topic, key, payload, string(metadata)}, nil
}

func validateTopic(topic string) error {
	if topic == "" {
		return errors.New("outbox publish: empty topic: name the topic the event goes to, e.g. \"orders\"")
	}
	if reason := checkText(topic); reason != "" {
		return fmt.Errorf("outbox publish: topic %q %s", topic, reason)
	}
	if len(topic) > maxFieldBytes {
		return fmt.Errorf("outbox publish: topic is %d bytes; at most %d", len(topic), maxFieldBytes)
	}
	return nil
}

// checkText reports why s cannot be stored as Postgres text or jsonb, or "" when it can.
// Postgres rejects NUL in both; encoding/json would silently replace invalid UTF-8.
func checkText(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "contains a NUL byte, which Postgres cannot store in text"
	}
	return ""
}

var errReadSide = errors.New("the outbox is read by the outboxkit forwarder, not by a watermill-sql subscriber")

// SelectQuery is not supported: see SchemaAdapter.
func (a SchemaAdapter) SelectQuery(wsql.SelectQueryParams) (wsql.Query, error) {
	return wsql.Query{}, errReadSide
}

// UnmarshalMessage is not supported: see SchemaAdapter.
func (a SchemaAdapter) UnmarshalMessage(wsql.UnmarshalMessageParams) (wsql.Row, error) {
	return wsql.Row{}, errReadSide
}

// SchemaInitializingQueries is not supported: create the tables with Migrate.
func (a SchemaAdapter) SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams) ([]wsql.Query, error) {
	return nil, errors.New("outbox tables are created by pipeline.Migrate (or `outboxctl migrate`), " +
		"not by AutoInitializeSchema")
}

// SubscribeIsolationLevel is part of watermill-sql's SchemaAdapter; the outbox is not subscribed to.
func (a SchemaAdapter) SubscribeIsolationLevel() stdsql.IsolationLevel { return stdsql.LevelDefault }
