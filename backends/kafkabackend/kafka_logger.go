package kafkabackend

import (
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outboxkit/internal/logs"
)

// kgoLogger hands franz-go's own logs — a member joining, syncing, its heartbeats failing, a
// session lost — to the subscriber's logger, so that a consumer group that stalls can be read in
// the service's logs: at INFO, its membership's every step; at WARN (the default level), what
// franz-go warns of or reports as an error, each message once per kgoWarnEvery — during an outage
// franz-go reports every failed dial, several a second, and the repeats go at INFO. franz-go's
// DEBUG lines (one per request) are not handed on: Level says INFO, so franz-go does not format them.
type kgoLogger struct {
	l      watermill.LoggerAdapter
	fields watermill.LogFields
	warned *kgoWarned
	// infoAsDebug hands franz-go's INFO lines on at DEBUG: a transactional producer's are four a
	// transaction (begin, flush, end), which say nothing an operator needs.
	infoAsDebug bool
}

// kgoWarnEvery is the least time between two WARN lines of one franz-go message.
const kgoWarnEvery = 30 * time.Second

// kgoWarned is when each franz-go message was last logged at WARN.
type kgoWarned struct {
	mu   sync.Mutex
	last map[string]time.Time
}

func newKgoLogger(l watermill.LoggerAdapter, fields watermill.LogFields) kgoLogger {
	return kgoLogger{l: l, fields: fields, warned: &kgoWarned{last: map[string]time.Time{}}}
}

// warn says whether msg, logged at WARN now, is its first in kgoWarnEvery.
func (w *kgoWarned) warn(msg string, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if t, ok := w.last[msg]; ok && now.Sub(t) < kgoWarnEvery {
		return false
	}
	if len(w.last) >= 256 { // franz-go's messages are a fixed set, some formatted: bound the map
		clear(w.last)
	}
	w.last[msg] = now
	return true
}

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelInfo }

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	fields := k.fields.Copy()
	for i := 0; i+1 < len(keyvals); i += 2 {
		fields[fmt.Sprint(keyvals[i])] = keyvals[i+1]
	}
	line := "Kafka client: " + msg
	switch level {
	case kgo.LogLevelError, kgo.LogLevelWarn:
		if k.warned.warn(msg, time.Now()) {
			logs.Warn(k.l, line, nil, fields)
			return
		}
		k.l.Info(line, fields.Add(watermill.LogFields{"repeated": true}))
	case kgo.LogLevelInfo:
		if k.infoAsDebug {
			k.l.Debug(line, fields)
			return
		}
		k.l.Info(line, fields)
	default:
		k.l.Debug(line, fields)
	}
}
