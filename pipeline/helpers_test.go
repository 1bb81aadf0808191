package pipeline_test

import (
	"database/sql"
	"testing"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
)

func insertParams(topic string, msgs ...*message.Message) wsql.InsertQueryParams {
	return wsql.InsertQueryParams{Topic: topic, Msgs: msgs}
}

func openDB(t *testing.T, url string) *sql.DB {
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}
