// Package pipeline is the write side of the outbox: the Watermill publisher that writes events
// into the outbox inside the application's own transaction, the events it writes (NewEvent,
// NewJSONEvent), and Migrate, which creates outboxkit's tables in any store.
//
//	tx, _ := db.BeginTx(ctx, nil)                         // the application's transaction
//	tx.ExecContext(ctx, `INSERT INTO orders …`)            // the business change
//	pub, _ := pipeline.NewPublisher(st, tx, pipeline.PublisherConfig{})
//	pub.Publish("orders", msg)                             // the event, in the same transaction
//	tx.Commit()                                            // both, or neither
//
// The forwarder (package forwarder) then relays committed rows to the broker.
package pipeline
