package testenv

import (
	"context"
	"database/sql"
	"net/url"
	"testing"
	"time"
)

// MySQL is a database of its own for one test on the shared MySQL or MariaDB server, dropped when
// the test ends.
type MySQL struct {
	// URL reaches the server with Database as the connection's default database.
	URL string
	// Database is the test's database.
	Database string
	// DB is a database/sql handle on URL.
	DB *sql.DB
}

// NewMySQL creates a fresh database and drops it when the test ends, so tests can run in
// parallel on one server.
func NewMySQL(t testing.TB) *MySQL {
	t.Helper()
	server := MySQLURL(t)
	name := UniqueName(t, "t")
	admin := OpenMySQL(t, server)
	ctx := context.Background()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	u, err := url.Parse(server)
	if err != nil {
		t.Fatalf("parse %s: %v", server, err)
	}
	u.Path = "/" + name
	m := &MySQL{URL: u.String(), Database: name, DB: OpenMySQL(t, u.String())}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	return m
}

// OpenMySQL opens a database/sql handle on a mysql:// URL, closed when the test ends.
func OpenMySQL(t testing.TB, rawURL string) *sql.DB {
	t.Helper()
	dsn, err := mysqlDSN(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatalf("open %s: %v", rawURL, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}
