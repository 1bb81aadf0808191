package testenv

import (
	"context"
	"database/sql"
	"net"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outboxkit/store/mysqlstore"
)

func probe(s *service, url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	switch s {
	case postgresService, pgLogicalService:
		db, err := sql.Open("pgx", url)
		if err != nil {
			return err
		}
		defer db.Close()
		return db.PingContext(ctx)
	case mysqlService:
		dsn, err := mysqlstore.DSN(url)
		if err != nil {
			return err
		}
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			return err
		}
		defer db.Close()
		return db.PingContext(ctx)
	case amqpService:
		conn, err := amqp.Dial(url)
		if err != nil {
			return err
		}
		return conn.Close()
	default:
		host := url[strings.Index(url, "://")+3:]
		if i := strings.IndexByte(host, '/'); i >= 0 {
			host = host[:i]
		}
		conn, err := net.DialTimeout("tcp", host, 5*time.Second)
		if err != nil {
			return err
		}
		return conn.Close()
	}
}

func mysqlDSN(rawURL string) (string, error) { return mysqlstore.DSN(rawURL) }
