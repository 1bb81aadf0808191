// Package testenv gives tests the real services they run against.
//
// Each service comes from an environment variable when it is set (make test and CI set them to the
// machine's local services); otherwise, when StartContainer is installed, from a container it
// starts; otherwise the test is skipped with a message naming the variable. Under CI=true (or
// OUTBOXKIT_REQUIRE_SERVICES) a missing service fails the test instead: a skipped test must never
// pass for a green run.
//
// The library's own package tests have no container fallback: they take the variables. Only the
// integration module (integration/) installs StartContainer, from its TestMains, with dockertest
// (integration/internal/containers), so that neither dockertest nor the Docker client it brings
// is a requirement of the library's module.
package testenv

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
)

// Environment variables naming the services.
const (
	EnvPostgres = "OUTBOXKIT_TEST_POSTGRES_URL"
	EnvAMQP     = "OUTBOXKIT_TEST_AMQP_URL"
	EnvNATS     = "OUTBOXKIT_TEST_NATS_URL"
	EnvRedis    = "OUTBOXKIT_TEST_REDIS_URL"
	EnvKafka    = "OUTBOXKIT_TEST_KAFKA_URL"
	EnvMySQL    = "OUTBOXKIT_TEST_MYSQL_URL"
	// EnvPGLogical names a Postgres server with wal_level = logical, for the log relay's tests:
	// scripts/pg-logical.sh starts a private one (the shared server is never restarted for it).
	EnvPGLogical = "OUTBOXKIT_TEST_PGLOGICAL_URL"
	// EnvMySQLBinlog names a MariaDB or MySQL server with the binary log on in ROW format, where the
	// binlog relay's tests may change global settings: scripts/mariadb-binlog.sh starts a private
	// one (the shared server is never reconfigured for it).
	EnvMySQLBinlog = "OUTBOXKIT_TEST_MYSQLBINLOG_URL"
)

// ContainerSpec is the container a service can be started in when its variable is unset.
type ContainerSpec struct {
	Repository, Tag string
	Env             []string // the container's environment, NAME=value
	Cmd             []string // arguments to the image's entry point
	Port            string   // the port the service listens on in the container, "5432/tcp"
	// URL is the service's URL, given the host address ("127.0.0.1:49153") Port is published on.
	URL func(hostPort string) string
	// Ready returns nil once the service answers at url; StartContainer retries it until then.
	Ready func(url string) error
}

// StartContainer starts spec's container and returns the service's URL once spec.Ready says it
// answers; while it is nil, no container is started. It is called at most once per service and
// test binary, the first time a test asks for a service whose variable is unset. Set it before the
// tests run (TestMain): the integration module's packages set it to
// integration/internal/containers.Start.
var StartContainer func(spec ContainerSpec) (url string, err error)

type service struct {
	env       string
	example   string
	container ContainerSpec

	once sync.Once
	got  string
	err  error
}

var (
	postgresService = &service{
		env:     EnvPostgres,
		example: "postgres://postgres@127.0.0.1:5432/test?sslmode=disable",
		container: ContainerSpec{
			Repository: "postgres", Tag: "16",
			Env:  []string{"POSTGRES_HOST_AUTH_METHOD=trust", "POSTGRES_DB=test"},
			Port: "5432/tcp",
			URL: func(hp string) string {
				return "postgres://postgres@" + hp + "/test?sslmode=disable"
			},
		},
	}
	pgLogicalService = &service{
		env:     EnvPGLogical,
		example: "$(scripts/pg-logical.sh url), after scripts/pg-logical.sh start",
		container: ContainerSpec{
			Repository: "postgres", Tag: "16",
			Cmd:  []string{"-c", "wal_level=logical", "-c", "max_slot_wal_keep_size=256MB", "-c", "max_replication_slots=32", "-c", "max_wal_senders=32"},
			Env:  []string{"POSTGRES_HOST_AUTH_METHOD=trust", "POSTGRES_DB=test"},
			Port: "5432/tcp",
			URL: func(hp string) string {
				return "postgres://postgres@" + hp + "/test?sslmode=disable"
			},
		},
	}
	amqpService = &service{
		env:     EnvAMQP,
		example: "amqp://guest:guest@127.0.0.1:5672/",
		container: ContainerSpec{
			Repository: "rabbitmq", Tag: "3.13",
			Port: "5672/tcp",
			URL:  func(hp string) string { return "amqp://guest:guest@" + hp + "/" },
		},
	}

	mysqlService = &service{
		env: EnvMySQL, example: "mysql://root@127.0.0.1:3306/test",
		container: ContainerSpec{
			Repository: "mariadb", Tag: "10.11",
			Env:  []string{"MARIADB_ALLOW_EMPTY_ROOT_PASSWORD=1", "MARIADB_DATABASE=test"},
			Port: "3306/tcp",
			URL:  func(hp string) string { return "mysql://root@" + hp + "/test" },
		},
	}
	mysqlBinlogService = &service{
		env: EnvMySQLBinlog, example: "$(scripts/mariadb-binlog.sh url), after scripts/mariadb-binlog.sh start",
		container: ContainerSpec{
			Repository: "mariadb", Tag: "10.11",
			Cmd: []string{"--log-bin", "--binlog-format=ROW", "--binlog-row-image=FULL", "--server-id=1",
				"--gtid-domain-id=1", "--gtid-strict-mode=ON"},
			Env:  []string{"MARIADB_ALLOW_EMPTY_ROOT_PASSWORD=1", "MARIADB_DATABASE=test"},
			Port: "3306/tcp",
			URL:  func(hp string) string { return "mysql://root@" + hp + "/test" },
		},
	}
	natsService = &service{
		env: EnvNATS, example: "nats://127.0.0.1:4222",
		container: ContainerSpec{
			Repository: "nats", Tag: "2", Cmd: []string{"-js"}, Port: "4222/tcp",
			URL: func(hp string) string { return "nats://" + hp },
		},
	}
	redisService = &service{
		env: EnvRedis, example: "redis://127.0.0.1:6379/0",
		container: ContainerSpec{
			Repository: "redis", Tag: "7", Port: "6379/tcp",
			URL: func(hp string) string { return "redis://" + hp + "/0" },
		},
	}
	kafkaService = &service{
		env: EnvKafka, example: "kafka://127.0.0.1:9092 (go run ./tools/kfake serves one)",
		container: ContainerSpec{
			Repository: "apache/kafka", Tag: "3.9.0", Port: "9092/tcp",
			Env: []string{"KAFKA_NUM_PARTITIONS=1", "KAFKA_AUTO_CREATE_TOPICS_ENABLE=true"},
			URL: func(hp string) string { return "kafka://" + hp },
		},
	}
)

// NATSURL returns the URL of a NATS server with JetStream for the test.
func NATSURL(t testing.TB) string { return natsService.get(t) }

// RedisURL returns the URL of a Redis server for the test.
func RedisURL(t testing.TB) string { return redisService.get(t) }

// KafkaURL returns kafka://host:port of a Kafka-protocol broker for the test.
func KafkaURL(t testing.TB) string { return kafkaService.get(t) }

// PostgresURL returns the URL of a Postgres server for the test.
func PostgresURL(t testing.TB) string { return postgresService.get(t) }

// PGLogicalURL returns the URL of a Postgres server with wal_level = logical, where a test may
// create replication slots and publications (scripts/pg-logical.sh starts one).
func PGLogicalURL(t testing.TB) string { return pgLogicalService.get(t) }

// MySQLURL returns the mysql:// URL of a MySQL 8 or MariaDB 10.6+ server for the test.
func MySQLURL(t testing.TB) string { return mysqlService.get(t) }

// MySQLBinlogURL returns the mysql:// URL of a MariaDB or MySQL server with the binary log on in
// ROW format, where a test may change global settings (scripts/mariadb-binlog.sh starts one).
func MySQLBinlogURL(t testing.TB) string { return mysqlBinlogService.get(t) }

// AMQPURL returns the URL of a RabbitMQ server for the test.
func AMQPURL(t testing.TB) string { return amqpService.get(t) }

func (s *service) get(t testing.TB) string {
	t.Helper()
	if v := strings.TrimSpace(os.Getenv(s.env)); v != "" {
		return v
	}
	msg := fmt.Sprintf("%s is not set: set %s=%s to run this test", s.env, s.env, s.example)
	if StartContainer != nil {
		s.once.Do(func() {
			spec := s.container
			spec.Ready = func(url string) error { return probe(s, url) }
			s.got, s.err = StartContainer(spec)
		})
		if s.err == nil {
			return s.got
		}
		msg = fmt.Sprintf("%s is not set and no container could be started (%v): set %s=%s to run this test",
			s.env, s.err, s.env, s.example)
	}
	if os.Getenv("CI") == "true" || os.Getenv("OUTBOXKIT_REQUIRE_SERVICES") != "" {
		t.Fatal("a missing service is a failure here, not a skip (CI=true or OUTBOXKIT_REQUIRE_SERVICES set): " + msg)
	}
	t.Skip(msg)
	return ""
}
