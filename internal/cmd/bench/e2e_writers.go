package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	wforwarder "github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/pgxstore"
)

// e2eOffer writes n events numbered from first, each in its own business transaction, on a fixed
// schedule at rate (open loop: a slow pipeline does not slow the offered rate down), from 16
// writers, and records each commit time in committed.
func e2eOffer(ctx context.Context, pool *pgxpool.Pool, writer *pgxstore.Store, topic, fwdTopic string, impl e2eImpl, first, n, perSec int, committed *sync.Map) (time.Duration, error) {
	slots := make(chan int, n)
	writeErr := make(chan error, 1)
	var writers sync.WaitGroup
	for range 16 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := range slots {
				if err := e2eWrite(ctx, pool, writer, topic, fwdTopic, impl, i, committed); err != nil {
					select {
					case writeErr <- err:
					default:
					}
					return
				}
			}
		}()
	}
	start := time.Now()
	for i := range n {
		if wait := time.Until(start.Add(time.Duration(float64(i) / float64(perSec) * float64(time.Second)))); wait > 0 {
			time.Sleep(wait)
		}
		slots <- first + i
	}
	close(slots)
	writers.Wait()
	select {
	case err := <-writeErr:
		return 0, err
	default:
		return time.Since(start), nil
	}
}

// e2eWrite is one business transaction: an order and its event.
func e2eWrite(ctx context.Context, pool *pgxpool.Pool, writer *pgxstore.Store, topic, fwdTopic string, impl e2eImpl, i int, committed *sync.Map) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO `+writer.Info().Schema+`.orders (customer) VALUES ($1) RETURNING id`, fmt.Sprint("c-", i%97)).Scan(&id); err != nil {
		return err
	}
	body, key := payload(i, 200)
	msg := pipeline.NewEvent("OrderPlaced", key, []byte(fmt.Sprintf(`{"id":%q,"order":%s}`, fmt.Sprint("e-", i), body)))
	if impl.stock {
		sqlPub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, watermill.NopLogger{})
		if err != nil {
			return err
		}
		if err := wforwarder.NewPublisher(sqlPub, wforwarder.PublisherConfig{ForwarderTopic: fwdTopic}).Publish(topic, msg); err != nil {
			return err
		}
	} else {
		pub, err := pipeline.NewPublisher(writer, tx, pipeline.PublisherConfig{})
		if err != nil {
			return err
		}
		if err := pub.Publish(topic, msg); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	committed.Store(msg.UUID, time.Now())
	return nil
}
