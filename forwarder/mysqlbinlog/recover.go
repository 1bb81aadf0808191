package mysqlbinlog

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/outboxkit/outboxkit/internal/logs"
)

// logGoneError is the server's refusal to send the binary log from where the session reads it
// (error 1236, ER_MASTER_FATAL_ERROR_READING_BINLOG): the binary logs holding the position are
// purged (expired, or PURGE BINARY LOGS, while the relay was down: the server keeps a file a
// replica reads), or the server is another one than the checkpoint's (a failover, a restore) and
// lacks its GTIDs or its file. The session recovers from the table (recoverFromTable).
type logGoneError struct {
	from position
	err  error
}

func (e logGoneError) Error() string {
	return fmt.Sprintf("the server cannot send the binary log from %s: %v", e.from, e.err)
}

func (e logGoneError) Unwrap() error { return e.err }

// errRecovered ends a session that recovered from a position the server cannot send the binary
// log from: the next session reads the rows left in the outbox, then the log from its end.
var errRecovered = errors.New("recovered from a checkpoint the server cannot send the binary log from")

// recoverFromTable does, once the server refused to send the log from the checkpoint, what a relay
// group's first start does. The relay removes a row from the outbox only once it is published, so
// the rows left there (not dead-lettered) are exactly the ones it may not have published, whatever
// the log lost: the binary log's end now is recorded as the checkpoint, on the connection that
// holds the group's lock, with the table's reading to do (backfilled false); the next session reads
// the table — its locking read waits for writers whose commit is in the log before that end but
// not yet visible — then the log from the end. Rows published since the last checkpoint are
// published again; rows backing off keep their attempts (the table's reading takes them); dead
// letters stay dead letters, and one replayed meanwhile waits in the table and goes.
//
// It runs after the session's dispatcher wrote its last checkpoint. The server refusing the log
// from its own end, or again from the position this Run's last recovery recorded (the checkpoint
// has not moved since), is a fault no recovery fixes: it is fatal.
func (s *session) recoverFromTable(ctx context.Context, gone logGoneError) error {
	r := s.r
	cp, err := r.readCheckpoint(ctx, s.conn)
	if err != nil {
		return err
	}
	lost := gone.from
	if cp.exists {
		lost = cp.pos // where the dispatcher's last checkpoint left it: the stretch skipped starts there
	}
	end, err := r.currentPosition(ctx, s.db, s.settings, s.gtid)
	if err != nil {
		return err
	}
	if s.samePosition(lost, end) || (r.recovered != nil && s.samePosition(lost, *r.recovered)) {
		return fatal("the server refuses to send the binary log from %s, where a recovery started the relay or the log ends, "+
			"so reading the rows left in the outbox and the log from its end cannot fix it: %v. Fix what the server's error "+
			"(and its error log) says, then start the relay again: the rows not yet published wait in the outbox", lost, gone.err)
	}
	if err := r.writeCheckpoint(ctx, s.conn, s.settings, s.progress(), end, false); err != nil {
		return err
	}
	r.recovered = &end
	n := r.hooks.recoveries.Add(1)
	logs.Warn(r.log, "Binlog relay cannot read the binary log from its checkpoint (its binary logs are purged, or the server is "+
		"another one): recovering as a first start does — the rows left in the outbox, the ones it may not have published, "+
		"are read from the table, then the binary log from its end; the rows published since the last checkpoint go again",
		gone.err, r.fields.Add(watermill.LogFields{"lost": lost.String(), "from": end.String(), "recoveries": n}))
	return errRecovered
}

// samePosition reports whether a and b are one place in the log as the session tracks progress:
// the same GTID set (as the checkpoint writes it), or the same file and position.
func (s *session) samePosition(a, b position) bool {
	if !s.gtid {
		return a.file == b.file && a.pos == b.pos
	}
	ga, errA := newGTIDPosition(s.settings.flavor, a.gtid)
	gb, errB := newGTIDPosition(s.settings.flavor, b.gtid)
	if errA != nil || errB != nil {
		return a.gtid == b.gtid
	}
	return ga.String() == gb.String()
}

// progress is how the session tracks it, as the checkpoint names it.
func (s *session) progress() string {
	if s.gtid {
		return "gtid"
	}
	return "file"
}
