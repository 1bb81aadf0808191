// The stock Watermill equivalent of testdata/ours: watermill-sql's MySQL publisher and
// subscriber, watermill-amqp, Watermill's forwarder and router.
package main

import (
	"context"
	stdsql "database/sql"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/go-sql-driver/mysql"
)

func main() {
	db, _ := stdsql.Open("mysql", "root@tcp(127.0.0.1:3306)/test")
	logger := watermill.NopLogger{}
	tx, _ := db.Begin()
	pub, _ := wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultMySQLSchema{}}, logger)
	outbox := forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: "outbox"})
	sub, _ := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{SchemaAdapter: wsql.DefaultMySQLSchema{},
		OffsetsAdapter: wsql.DefaultMySQLOffsetsAdapter{}}, logger)
	amqpPub, _ := amqp.NewPublisher(amqp.NewDurablePubSubConfig("amqp://", nil), logger)
	f, _ := forwarder.NewForwarder(sub, amqpPub, logger, forwarder.Config{ForwarderTopic: "outbox"})
	_ = f.Run(context.Background())
	amqpSub, _ := amqp.NewSubscriber(amqp.NewDurablePubSubConfig("amqp://", amqp.GenerateQueueNameTopicNameWithSuffix("x")), logger)
	r, _ := message.NewRouter(message.RouterConfig{}, logger)
	_, _, _ = r, outbox, amqpSub
}
