package kafkabackend

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit/internal/logs"
)

// kgoLogger hands franz-go's own logs — a member joining, syncing, its heartbeats failing, a
// session lost — to the subscriber's logger, so that a consumer group that stalls can be read in
// the service's logs: at INFO, its membership's every step; at WARN (the default level), what
// franz-go warns of or reports as an error. franz-go's DEBUG lines (one per request) are not handed
// on: Level says INFO, so franz-go does not format them.
type kgoLogger struct {
	l      watermill.LoggerAdapter
	fields watermill.LogFields
}

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelInfo }

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	fields := k.fields.Copy()
	for i := 0; i+1 < len(keyvals); i += 2 {
		fields[fmt.Sprint(keyvals[i])] = keyvals[i+1]
	}
	msg = "Kafka client: " + msg
	switch level {
	case kgo.LogLevelError, kgo.LogLevelWarn:
		logs.Warn(k.l, msg, nil, fields)
	case kgo.LogLevelInfo:
		k.l.Info(msg, fields)
	default:
		k.l.Debug(msg, fields)
	}
}
