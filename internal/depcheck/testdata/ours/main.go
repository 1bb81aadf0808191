// A service on MySQL and RabbitMQ with outboxkit: the store, the transaction-bound publisher, the
// forwarder to RabbitMQ, and the consumer middleware stack on a RabbitMQ subscriber.
package main

import (
	"context"
	"database/sql"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/backends/amqpbackend"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/middleware"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store/mysqlstore"
)

func main() {
	db, _ := sql.Open("mysql", "root@tcp(127.0.0.1:3306)/test")
	st, _ := mysqlstore.New(db, mysqlstore.Config{})
	tx, _ := db.Begin()
	p, _ := pipeline.NewPublisher(st, tx, pipeline.PublisherConfig{})
	_ = p
	pub, _ := amqpbackend.NewPublisher(amqpbackend.PublisherConfig{URL: "amqp://"})
	f, _ := forwarder.New(forwarder.Config{Store: st, Publisher: pub})
	_ = f.Run(context.Background())
	stack, _ := middleware.Stack(middleware.StackConfig{Store: st, Consumer: "x"})
	sub, _ := amqpbackend.NewSubscriber(amqpbackend.SubscriberConfig{URL: "amqp://", ConsumerGroup: "x"})
	r, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	_, _, _ = r, stack, sub
}
