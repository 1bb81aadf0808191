package pg

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgxlisten"
)

// listener holds a LISTEN connection of its own until its context ends. pgxlisten reconnects
// after failures; on every (re)connect the relay is woken, since notifications sent while it was
// disconnected are lost.
type listener struct {
	channel string
	connect func(ctx context.Context) (*pgx.Conn, error)
	retry   time.Duration
}

func (l *listener) Listen(ctx context.Context, wake, listening func(), logErr func(error)) {
	pl := &pgxlisten.Listener{
		Connect: l.connect,
		LogError: func(ctx context.Context, err error) {
			if ctx.Err() == nil {
				logErr(err)
			}
		},
		ReconnectDelay: l.retry,
	}
	pl.Handle(l.channel, wakeHandler{onNotify: wake, onListen: func() { listening(); wake() }})
	_ = pl.Listen(ctx) // returns only when ctx ends
}

// wakeHandler turns notifications into wake-ups. As a pgxlisten.BacklogHandler it learns when
// LISTEN has been issued on a new connection.
type wakeHandler struct {
	onNotify func()
	onListen func()
}

func (h wakeHandler) HandleNotification(context.Context, *pgconn.Notification, *pgx.Conn) error {
	h.onNotify()
	return nil
}

func (h wakeHandler) HandleBacklog(context.Context, string, *pgx.Conn) error {
	h.onListen()
	return nil
}
