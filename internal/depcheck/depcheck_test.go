// Package depcheck pins what each outboxkit package makes a program compile, so that a service
// pays only for the store and the broker it uses, and that cannot creep back unnoticed.
package depcheck

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/outboxkit/outboxkit"

// deps lists the packages a program importing pkg compiles.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, ee.Stderr)
		}
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// The clients and libraries only some programs want, by the name a reader knows them by.
var heavy = map[string]string{
	"github.com/jackc/pgx/v5":                        "pgx",
	"github.com/jackc/pglogrepl":                     "pglogrepl",
	"github.com/go-mysql-org/go-mysql":               "go-mysql",
	"github.com/pingcap/tidb":                        "go-mysql", // what go-mysql compiles of TiDB's parser, with its logger
	"go.uber.org/zap":                                "go-mysql",
	"github.com/lib/pq":                              "lib/pq",
	"github.com/go-sql-driver/mysql":                 "go-sql-driver/mysql",
	"modernc.org/sqlite":                             "modernc.org/sqlite",
	"github.com/rabbitmq/amqp091-go":                 "amqp091-go",
	"github.com/ThreeDotsLabs/watermill-amqp":        "watermill-amqp",
	"github.com/IBM/sarama":                          "sarama",
	"github.com/ThreeDotsLabs/watermill-kafka":       "watermill-kafka",
	"github.com/nats-io/nats.go":                     "nats.go",
	"github.com/ThreeDotsLabs/watermill-nats":        "watermill-nats",
	"github.com/redis/go-redis":                      "go-redis",
	"github.com/ThreeDotsLabs/watermill-redisstream": "watermill-redisstream",
	"github.com/ThreeDotsLabs/watermill-sql":         "watermill-sql",
	"github.com/prometheus/client_golang":            "prometheus",
	"go.opentelemetry.io/otel/propagation":           "otel/propagation",
	"go.opentelemetry.io/otel/sdk":                   "otel/sdk",
	"github.com/ory/dockertest":                      "dockertest", // the tools only tests use: no library package may compile them
	"github.com/chromedp":                            "chromedp",
	"github.com/twmb/franz-go/pkg/kfake":             "kfake",
	"github.com/twmb/franz-go/pkg/kgo":               "franz-go",
	"net/http":                                       "net/http",
}

// allowed names, per package, the heavy libraries it may compile: its own client and nothing else.
var allowed = map[string][]string{
	"":                         nil, // the root package: metadata keys and error markers
	"store":                    nil,
	"store/mysqlstore":         {"go-sql-driver/mysql"},
	"store/sqlitestore":        {"modernc.org/sqlite"},
	"store/pgsqlstore":         {"pgx"}, // pgx's stdlib is its default driver and its LISTEN connection; lib/pq only if the program imports it
	"store/pgxstore":           {"pgx"},
	"pipeline":                 nil,
	"forwarder":                nil,
	"forwarder/pglog":          {"pgx", "pglogrepl"},                            // the log relay: Postgres's replication protocol
	"forwarder/mysqlbinlog":    {"go-mysql", "go-sql-driver/mysql", "net/http"}, // the binlog relay: MySQL's replication protocol (go-mysql compiles net/http), its store's driver
	"middleware":               nil,
	"handlers":                 nil,
	"backends":                 nil,
	"backends/memorybackend":   nil,
	"backends/amqpbackend":     {"amqp091-go", "watermill-amqp"},
	"backends/kafkabackend":    {"franz-go"},                              // one Kafka client, producer and consumers
	"backends/natsbackend":     {"nats.go", "watermill-nats", "net/http"}, // nats.go's own
	"backends/redisbackend":    {"go-redis", "watermill-redisstream"},
	"backends/postgresbackend": {"watermill-sql", "pgx", "lib/pq"}, // watermill-sql imports both drivers
	"prom":                     {"prometheus", "net/http"},         // the client's own
	"idempotency":              {"net/http"},
	"console":                  {"net/http"},                                                      // a handler: net/http and its own templates, no store or broker client
	"fleet":                    nil,                                                               // the member: stores come through its Opener
	"fleet/fleetstores":        {"pgx", "pglogrepl", "go-sql-driver/mysql", "modernc.org/sqlite"}, // opens any outbox by URL
}

func TestEachPackageCompilesOnlyItsOwnClient(t *testing.T) {
	t.Parallel()
	for rel, ok := range allowed {
		pkg := module
		if rel != "" {
			pkg += "/" + rel
		}
		t.Run(strings.ReplaceAll(rel+"/", "/", "_"), func(t *testing.T) {
			t.Parallel()
			found := map[string]bool{}
			for _, d := range deps(t, pkg) {
				for prefix, name := range heavy {
					if d == prefix || strings.HasPrefix(d, prefix+"/") {
						found[name] = true
					}
				}
			}
			for name := range found {
				permitted := false
				for _, a := range ok {
					permitted = permitted || a == name
				}
				if !permitted {
					t.Errorf("%s compiles %s: a program importing it pays for a client it may not use", pkg, name)
				}
			}
		})
	}
}

// A service on MySQL and RabbitMQ (store, publisher, forwarder, consumer stack) compiles no more
// than 1.1 times the packages of the stock Watermill equivalent (watermill-sql on MySQL,
// watermill-amqp, Watermill's forwarder and router).
func TestAMySQLAndRabbitMQServiceIsNotHeavierThanStockWatermill(t *testing.T) {
	t.Parallel()
	ours := deps(t, "./testdata/ours")
	stock := deps(t, "./testdata/stock")
	ratio := float64(len(ours)) / float64(len(stock))
	t.Logf("outboxkit %d packages, stock Watermill %d: %.2fx", len(ours), len(stock), ratio)
	if ratio > 1.1 {
		t.Fatalf("outboxkit's MySQL + RabbitMQ service compiles %d packages, %.2fx the stock equivalent's %d; want at most 1.1x",
			len(ours), ratio, len(stock))
	}
}

// testOnly are the modules only outboxkit's tests use, kept in the integration module's go.mod
// (integration/go.mod) so that they and what they require — the Docker client, the Chrome DevTools
// protocol, Sarama's compression codecs and Kerberos — are in no user's module graph. Sarama and
// watermill-kafka are how the tests prove that stock Watermill reads what the Kafka backend, on
// franz-go, writes.
var testOnly = map[string]string{
	"github.com/ory/dockertest":                "dockertest",
	"github.com/chromedp":                      "chromedp",
	"github.com/twmb/franz-go/pkg/kfake":       "kfake",
	"github.com/IBM/sarama":                    "sarama",
	"github.com/ThreeDotsLabs/watermill-kafka": "watermill-kafka",
}

// The library's module graph — what a service requiring outboxkit inherits, and a vulnerability
// scan of it reads — holds none of the tools only the tests use. GOWORK=off: the workspace would
// add the integration module's requirements.
func TestTheModuleGraphHoldsNoTestOnlyTool(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Path}}", "all")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list -m all: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list -m all: %v", err)
	}
	mods := strings.Fields(string(out))
	if len(mods) < 2 || mods[0] != module {
		t.Fatalf("go list -m all lists %q: want %s and its requirements", mods, module)
	}
	for _, m := range mods[1:] {
		for prefix, name := range testOnly {
			if m == prefix || strings.HasPrefix(m, prefix+"/") {
				t.Errorf("the library's module graph holds %s (%s), which only tests use: require it in integration/go.mod instead", m, name)
			}
		}
	}
}
