package pglog

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// errDispatcherFailed stops the reader once the dispatcher failed; the session returns the
// dispatcher's own error instead.
var errDispatcherFailed = errors.New("the dispatcher failed")

// send hands it to the dispatcher, keeping the server informed while the dispatcher is behind.
func (s *session) send(ctx context.Context, it item, nextStatus *time.Time) error {
	for {
		t := time.NewTimer(time.Until(*nextStatus))
		select {
		case s.in <- it:
			t.Stop()
			s.sent.Add(1)
			return nil
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-s.failed:
			t.Stop()
			return errDispatcherFailed
		case <-t.C:
			if err := s.sendStatus(); err != nil {
				return err
			}
			*nextStatus = time.Now().Add(s.r.cfg.StatusInterval)
		}
	}
}

// sendStatus confirms to the server the position below which everything is published: the end of
// the last transaction whose events are all published and removed, or, when the relay had nothing
// in flight as of a keepalive, the server's WAL end at that keepalive (the outbox retains no WAL
// while other tables write).
func (s *session) sendStatus() error {
	lsn := pglogrepl.LSN(s.ack.Load())
	if s.idleLSN > lsn && s.flushed.Load() >= s.idleAtSent {
		lsn = s.idleLSN
	}
	if lsn < s.lastSent {
		lsn = s.lastSent
	}
	if s.conn.IsClosed() {
		// A failed read closed the connection, and pgconn's goroutine is writing its goodbye on it:
		// writing too would race with that, and would reach no server. The slot keeps the position
		// last confirmed; the next session reads again from there.
		return errors.New("send standby status: the replication connection is closed")
	}
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: lsn})
	if err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	s.lastSent = lsn
	return nil
}

// read streams the slot into the dispatcher until ctx ends or the connection fails.
func (s *session) read(ctx context.Context) error {
	interval := s.r.cfg.StatusInterval
	nextStatus := time.Now().Add(interval)
	dec := newDecoder(s.r)
	inTxn := false
	for {
		if !time.Now().Before(nextStatus) {
			if err := s.sendStatus(); err != nil {
				return err
			}
			nextStatus = time.Now().Add(interval)
		}
		select {
		case <-s.failed:
			return errDispatcherFailed
		default:
		}
		rctx, cancel := context.WithDeadline(ctx, nextStatus)
		msg, err := s.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("read slot %s: %w", s.r.cfg.SlotName, err)
		}
		switch msg := msg.(type) {
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("read slot %s: %w", s.r.cfg.SlotName, pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return fmt.Errorf("read slot %s: the server ended the stream", s.r.cfg.SlotName)
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				continue
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("read slot %s: %w", s.r.cfg.SlotName, err)
				}
				if !inTxn {
					s.idleLSN, s.idleAtSent = ka.ServerWALEnd, s.sent.Load()
				}
				if ka.ReplyRequested {
					nextStatus = time.Time{}
				}
			case pglogrepl.XLogDataByteID:
				x, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return fmt.Errorf("read slot %s: %w", s.r.cfg.SlotName, err)
				}
				m, err := pglogrepl.Parse(x.WALData)
				if err != nil {
					return fmt.Errorf("read slot %s: decode pgoutput: %w", s.r.cfg.SlotName, err)
				}
				switch m := m.(type) {
				case *pglogrepl.BeginMessage:
					inTxn = true
					dec.begin(m)
				case *pglogrepl.CommitMessage:
					inTxn = false
					if err := s.send(ctx, item{end: m.TransactionEndLSN}, &nextStatus); err != nil {
						return sendErr(err)
					}
				case *pglogrepl.RelationMessage:
					dec.relations[m.RelationID] = m
				case *pglogrepl.LogicalDecodingMessage:
					it, ok := dec.message(m)
					if ok {
						if err := s.send(ctx, it, &nextStatus); err != nil {
							return sendErr(err)
						}
					}
				case *pglogrepl.InsertMessage:
					it, ok, err := dec.insert(m)
					if err != nil {
						return fmt.Errorf("read slot %s: %w", s.r.cfg.SlotName, err)
					}
					if ok {
						if err := s.send(ctx, it, &nextStatus); err != nil {
							return sendErr(err)
						}
					}
				}
			}
		}
	}
}

// sendErr is the reader's error when a send did not go through: none when the relay stops.
func sendErr(err error) error {
	if errors.Is(err, errDispatcherFailed) {
		return err
	}
	return nil
}
