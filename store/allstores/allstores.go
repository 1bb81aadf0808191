// Package allstores links every store driver into the program, so that store.Open opens any
// database URL: postgres:// (store/pgsqlstore), mysql:// (store/mysqlstore) and sqlite://
// (store/sqlitestore). A service on one database imports that driver alone and compiles only its
// client; tools that take any URL (outboxctl, the demo) import this package.
package allstores

import (
	_ "github.com/outboxkit/outboxkit/store/mysqlstore"  // mysql://
	_ "github.com/outboxkit/outboxkit/store/pgsqlstore"  // postgres://
	_ "github.com/outboxkit/outboxkit/store/sqlitestore" // sqlite://
)
