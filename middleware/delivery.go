package middleware

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/internal/schema"
)

// delivery is what the middlewares learn about one delivery of a message, shared through the
// message context from the outermost middleware inward.
type delivery struct {
	count        int  // persistent delivery count; 0 when DeliveryCount is not in the stack
	counted      bool // DeliveryCount has counted this delivery (in-process retries do not count again)
	duplicate    bool
	deadLettered bool

	// conn is the connection DeliveryCount holds for the whole delivery, with the message's
	// advisory lock: the middlewares inside do their database work on it, so a delivery needs one
	// connection however many steps it takes, and no two deliveries of a message overlap.
	conn *pgxpool.Conn
}

// querier is what a middleware needs of the database: the delivery's connection, or the pool.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// db returns the delivery's connection when DeliveryCount holds one, else pool.
func (d *delivery) db(pool *pgxpool.Pool) querier {
	if d.conn != nil {
		return d.conn
	}
	return pool
}

type deliveryKey struct{}

// deliveryOf returns the message's delivery record, attaching one when there is none yet.
func deliveryOf(msg *message.Message) *delivery {
	if d, ok := msg.Context().Value(deliveryKey{}).(*delivery); ok {
		return d
	}
	d := &delivery{}
	msg.SetContext(context.WithValue(msg.Context(), deliveryKey{}, d))
	return d
}

// Deliveries returns how many times the message being handled has been delivered to this consumer,
// this delivery included, as counted by DeliveryCount; 0 without it.
func Deliveries(ctx context.Context) int {
	if d, ok := ctx.Value(deliveryKey{}).(*delivery); ok {
		return d.count
	}
	return 0
}

// base holds what every database-backed middleware needs.
type base struct {
	pool     *pgxpool.Pool
	schema   schema.Name
	consumer string
}

var consumerName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$`)

func newBase(pool *pgxpool.Pool, schemaName, consumer string) (base, error) {
	var errs []error
	if pool == nil {
		errs = append(errs, errors.New("field Pool is required: pass the *pgxpool.Pool of the database holding the inbox"))
	}
	name, err := schema.Parse(schemaName)
	if err != nil {
		errs = append(errs, fmt.Errorf("field Schema: %w", err))
	}
	if !consumerName.MatchString(consumer) {
		errs = append(errs, fmt.Errorf("field Consumer %q: name the consuming service (letters, digits, '.', '_', ':', '-', "+
			"at most 100 characters), e.g. \"shipping\"; it keys the inbox, so it must not change", consumer))
	}
	return base{pool: pool, schema: name, consumer: consumer}, errors.Join(errs...)
}
