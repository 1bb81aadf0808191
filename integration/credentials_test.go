package integration

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outboxkit"
	"github.com/outboxkit/outboxkit/backends"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/internal/testenv"
	"github.com/outboxkit/outboxkit/store"
	"github.com/outboxkit/outboxkit/store/pgxstore"
	"github.com/outboxkit/outboxkit/store/sqlitestore"
)

// withPassword returns rawURL with its password replaced.
func withPassword(t *testing.T, rawURL, password string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	name := "guest"
	if u.User != nil {
		name = u.User.Username()
	}
	u.User = url.UserPassword(name, password)
	return u.String()
}

// RabbitMQ refusing the credentials (403 ACCESS_REFUSED) is no outage: the forwarder refuses to
// start, saying so, and a consumer's first Subscribe fails instead of retrying in the background
// for ever.
func TestCredentials_AMQPRefusalFailsAtStart(t *testing.T) {
	t.Parallel()
	wrong := withPassword(t, testenv.AMQPURL(t), "not-the-password")
	b := openBackend(t, wrong, backends.Options{})
	st, err := sqlitestore.Open(context.Background(), t.TempDir()+"/outbox.db")
	if err != nil {
		t.Fatal(err)
	}
	defer st.DB().Close()
	if _, err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	relay, err := forwarder.New(forwarder.Config{Store: st, Publisher: b.Publisher})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = relay.Run(ctx)
	if !outboxkit.IsAccessDenied(err) || outboxkit.IsUnreachable(err) || strings.Contains(err.Error(), "not-the-password") {
		t.Fatalf("Run against a broker refusing the credentials: %v; want an access-denied error, without the password", err)
	}
	sub, err := b.NewSubscriber("shipping")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if _, err := sub.Subscribe(ctx, testenv.UniqueName(t, "refused")); !outboxkit.IsAccessDenied(err) {
		t.Fatalf("Subscribe against a broker refusing the credentials: %v; want an access-denied error at once", err)
	}
}

// MySQL refusing the password (1045) is an access-denied error, not an unreachable database: the
// store says so and the forwarder refuses to start.
func TestCredentials_MySQLRefusalIsAccessDenied(t *testing.T) {
	t.Parallel()
	wrong := withPassword(t, testenv.MySQLURL(t), "not-the-password")
	if _, err := store.Open(context.Background(), wrong, store.OpenOptions{}); !outboxkit.IsAccessDenied(err) || outboxkit.IsUnreachable(err) {
		t.Fatalf("open with a wrong password: %v; want an access-denied error", err)
	}
}

// Postgres refusing the role (SQLSTATE 28000, the shared server trusts any password) is an
// access-denied error on both Postgres stores.
func TestCredentials_PostgresRefusalIsAccessDenied(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("no_such_role_" + strings.ToLower(testenv.UniqueName(t, "r")))
	_, err = store.Open(context.Background(), u.String(), store.OpenOptions{})
	if !outboxkit.IsAccessDenied(err) || outboxkit.IsUnreachable(err) {
		t.Fatalf("open as a role that does not exist: %v; want an access-denied error", err)
	}
	if errors.Is(err, store.ErrNotMigrated) {
		t.Fatal("a refused role reported as missing tables")
	}
	if _, err := pgxstore.Open(context.Background(), u.String(), pgxstore.Config{}); !outboxkit.IsAccessDenied(err) || outboxkit.IsUnreachable(err) {
		t.Fatalf("pgxstore.Open as a role that does not exist: %v; want an access-denied error", err)
	}
}
