package kafkabackend

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kgo"
)

// franz-go's errors reach the logger at WARN (a logger without a WARN level: ERROR) once per
// message and kgoWarnEvery; its repeats, during an outage several a second, go at INFO; its
// membership steps at INFO, with their fields.
func TestKgoLogger_WarnsOncePerMessageThenLogsRepeatsAtInfo(t *testing.T) {
	capture := watermill.NewCaptureLogger()
	l := newKgoLogger(capture, watermill.LogFields{"consumer_group": "billing"})
	for range 3 {
		l.Log(kgo.LogLevelError, "unable to request api versions", "broker", "0")
	}
	l.Log(kgo.LogLevelWarn, "join group failed", "group", "billing")
	l.Log(kgo.LogLevelInfo, "joining group", "group", "billing")
	l.Log(kgo.LogLevelDebug, "wrote request")

	got := capture.Captured()
	var errs []string
	for _, m := range got[watermill.ErrorLogLevel] {
		errs = append(errs, m.Msg)
	}
	if len(errs) != 2 || errs[0] != "Kafka client: unable to request api versions" || errs[1] != "Kafka client: join group failed" {
		t.Fatalf("at WARN/ERROR: %q, want each franz-go error and warning once", errs)
	}
	if f := got[watermill.ErrorLogLevel][0].Fields; f["broker"] != "0" || f["consumer_group"] != "billing" {
		t.Fatalf("fields %v, want franz-go's key-values and the subscription's", f)
	}
	var repeats, steps int
	for _, m := range got[watermill.InfoLogLevel] {
		switch {
		case m.Msg == "Kafka client: unable to request api versions" && m.Fields["repeated"] == true:
			repeats++
		case m.Msg == "Kafka client: joining group":
			steps++
		default:
			t.Fatalf("unexpected INFO line %q %v", m.Msg, m.Fields)
		}
	}
	if repeats != 2 || steps != 1 {
		t.Fatalf("at INFO: %d repeats and %d membership steps, want 2 and 1", repeats, steps)
	}
	if n := len(got[watermill.DebugLogLevel]); n != 1 {
		t.Fatalf("%d DEBUG lines, want franz-go's debug line at DEBUG", n)
	}

	// Once kgoWarnEvery has passed, the message warns again.
	w := &kgoWarned{last: map[string]time.Time{}}
	now := time.Now()
	if !w.warn("m", now) || w.warn("m", now.Add(kgoWarnEvery-time.Millisecond)) || !w.warn("m", now.Add(kgoWarnEvery)) {
		t.Fatal("a message warns once per kgoWarnEvery")
	}
}

// A transactional producer's franz-go INFO lines — four a transaction — go at DEBUG; its warnings
// still at WARN.
func TestKgoLogger_InfoAsDebug(t *testing.T) {
	capture := watermill.NewCaptureLogger()
	l := newKgoLogger(capture, nil)
	l.infoAsDebug = true
	l.Log(kgo.LogLevelInfo, "beginning transaction")
	l.Log(kgo.LogLevelWarn, "producer id load failed")
	got := capture.Captured()
	if len(got[watermill.InfoLogLevel]) != 0 || len(got[watermill.DebugLogLevel]) != 1 || len(got[watermill.ErrorLogLevel]) != 1 {
		t.Fatalf("INFO %v, DEBUG %v, WARN %v: want the INFO line at DEBUG and the warning at WARN",
			got[watermill.InfoLogLevel], got[watermill.DebugLogLevel], got[watermill.ErrorLogLevel])
	}
}
