package console_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	"github.com/outboxkit/outboxkit/console"
	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/pipeline"
	"github.com/outboxkit/outboxkit/store"
	_ "github.com/outboxkit/outboxkit/store/sqlitestore" // registers sqlite://; import your database's driver
)

// The console mounted under /console of the team's own server, behind the team's own
// middleware, without http.StripPrefix: it writes every link under its Prefix.
func ExampleNew() {
	dir, _ := os.MkdirTemp("", "console-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	db, err := store.Open(ctx, "sqlite://"+filepath.Join(dir, "shop.db"), store.OpenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := pipeline.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	// In production: console.TokensFromEnv(), reading OUTBOXKIT_CONSOLE_TOKENS.
	tokens, err := console.ParseTokens("alice:operator:a-long-random-secret-1,carol:viewer:a-long-random-secret-2")
	if err != nil {
		log.Fatal(err)
	}
	h, err := console.New(console.Config{Store: db, Prefix: "/console", Auth: console.Auth{Tokens: tokens}})
	if err != nil {
		log.Fatal(err)
	}
	if err := h.Start(ctx); err != nil { // runs replay and archive jobs until Stop
		log.Fatal(err)
	}
	defer func() {
		// Bounded: a job still running then keeps its state, and resumes once its lease runs out.
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := h.Stop(sctx); err != nil {
			log.Print(err)
		}
	}()

	teamAuth := func(next http.Handler) http.Handler { return next } // the team's own middleware
	mux := http.NewServeMux()
	mux.Handle("/console/", teamAuth(h))

	r := httptest.NewRequest("GET", "/console/", nil)
	r.Header.Set("Authorization", "Bearer a-long-random-secret-2")
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, r)
	fmt.Println(w.Code, w.Header().Get("Content-Type"))
	// Output: 200 text/html; charset=utf-8
}

// The console of a relay fleet: the fleet's page at /console/ — its members, and who relays each
// outbox, those without an owner first — and each tenant's console under /console/t/{tenant}/,
// opened from the catalog on first use. Here every database is a SQLite file; in production the
// coordination database and the tenants' are Postgres or MySQL (a schema per tenant, opened with
// fleetstores.Opener()), and the catalog is fleet.TableCatalog over the application's table.
func ExampleNewFleet() {
	dir, _ := os.MkdirTemp("", "console-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	coord, err := store.Open(ctx, "sqlite://"+filepath.Join(dir, "coordination.db"), store.OpenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer coord.Close()
	if _, err := pipeline.Migrate(ctx, coord); err != nil {
		log.Fatal(err)
	}
	var catalog fleet.Outboxes // as the fleet's members are given it
	for _, tenant := range []string{"acme", "globex"} {
		url := "sqlite://" + filepath.Join(dir, tenant+".db")
		db, err := store.Open(ctx, url, store.OpenOptions{})
		if err != nil {
			log.Fatal(err)
		}
		if _, err := pipeline.Migrate(ctx, db); err != nil {
			log.Fatal(err)
		}
		db.Close()
		catalog = append(catalog, fleet.Outbox{Name: tenant, URL: url})
	}
	tokens, err := console.ParseTokens("alice:operator:a-long-random-secret-1")
	if err != nil {
		log.Fatal(err)
	}
	h, err := console.NewFleet(console.FleetConfig{
		Coordination: coord,
		Fleet:        "orders-relays",
		Catalog:      catalog,
		Prefix:       "/console",
		Auth:         console.Auth{Tokens: tokens},        // one sign-in for the fleet and every tenant
		Console:      console.Config{Environment: "test"}, // what each tenant's console is given
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := h.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := h.Stop(ctx); err != nil { // stops each tenant's console and closes its store
			log.Print(err)
		}
	}()

	mux := http.NewServeMux()
	mux.Handle("/console/", h)
	for _, path := range []string{"/console/", "/console/t/acme/letters", "/console/t/initech/"} {
		r := httptest.NewRequest("GET", path, nil)
		r.Header.Set("Authorization", "Bearer a-long-random-secret-1")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Println(path, w.Code)
	}
	// Output:
	// /console/ 200
	// /console/t/acme/letters 200
	// /console/t/initech/ 404
}

// The console alone, as `outboxctl console` runs it: without credentials it serves this machine
// only, and refuses to listen beyond loopback.
func ExampleListenAndServe() {
	dir, _ := os.MkdirTemp("", "console-example")
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(context.Background())
	db, err := store.Open(ctx, "sqlite://"+filepath.Join(dir, "shop.db"), store.OpenOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if _, err := pipeline.Migrate(ctx, db); err != nil {
		log.Fatal(err)
	}
	h, err := console.New(console.Config{Store: db, Auth: console.Auth{LocalOnly: true}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(console.ListenAndServe(ctx, "0.0.0.0:8089", h, nil) != nil)
	err = console.ListenAndServe(ctx, "127.0.0.1:0", h, func(addr string) {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			fmt.Println(resp.StatusCode)
			resp.Body.Close()
		}
		cancel() // the server stops, and with it the console's jobs
	})
	fmt.Println(err)
	// Output:
	// true
	// 200
	// <nil>
}
