// Package logs gives every outboxkit component the same default logger and a WARN level.
//
// Watermill's LoggerAdapter has no WARN level; an operator must still see, without turning on
// INFO, what needs them (a row dead-lettered, a consumer held by a misconfiguration). Warn logs at
// WARN through a logger that has a Warn method (Default has) and at ERROR through one that has not.
package logs

import (
	"context"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill"
)

// Default is the logger of a component given none: the process's slog.Default(), at WARN and
// above, so that an outage at start or a dead letter is never silent, and routine lines are.
func Default() watermill.LoggerAdapter { return slogAdapter{fields: nil} }

type slogAdapter struct{ fields watermill.LogFields }

func (l slogAdapter) log(level slog.Level, msg string, err error, fields watermill.LogFields) {
	logger := slog.Default()
	if !logger.Enabled(context.Background(), level) {
		return
	}
	all := l.fields.Add(fields)
	attrs := make([]any, 0, 2*len(all)+2)
	if err != nil {
		attrs = append(attrs, "error", err.Error())
	}
	for k, v := range all {
		attrs = append(attrs, k, v)
	}
	logger.Log(context.Background(), level, msg, attrs...)
}

func (l slogAdapter) Error(msg string, err error, fields watermill.LogFields) {
	l.log(slog.LevelError, msg, err, fields)
}
func (l slogAdapter) Warn(msg string, fields watermill.LogFields) {
	l.log(slog.LevelWarn, msg, nil, fields)
}
func (l slogAdapter) Info(string, watermill.LogFields)  {}
func (l slogAdapter) Debug(string, watermill.LogFields) {}
func (l slogAdapter) Trace(string, watermill.LogFields) {}
func (l slogAdapter) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return slogAdapter{fields: l.fields.Add(fields)}
}

// warner is a logger with a WARN level.
type warner interface {
	Warn(msg string, fields watermill.LogFields)
}

// Warn logs what an operator must see but is not a failure of the component itself: at WARN where
// l has that level, else at ERROR (with err, which may be nil).
func Warn(l watermill.LoggerAdapter, msg string, err error, fields watermill.LogFields) {
	if w, ok := l.(warner); ok {
		if err != nil {
			fields = fields.Add(watermill.LogFields{"error": err.Error()})
		}
		w.Warn(msg, fields)
		return
	}
	l.Error(msg, err, fields)
}
