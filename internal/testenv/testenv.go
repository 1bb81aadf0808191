// Package testenv gives tests the real services they run against.
//
// Each service comes from an environment variable when it is set (CI sets them to the machine's
// local services); otherwise from a container started with dockertest when a Docker engine
// answers; otherwise the test is skipped with a message naming the variable. Under CI=true a
// missing service fails the test instead: a skipped test must never pass for a green run.
package testenv

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"
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
)

type service struct {
	env        string
	example    string
	repository string
	tag        string
	cmd        []string
	envVars    []string
	port       string
	url        func(hostPort string) string

	once sync.Once
	got  string
	err  error
}

var (
	postgresService = &service{
		env:        EnvPostgres,
		example:    "postgres://postgres@127.0.0.1:5432/test?sslmode=disable",
		repository: "postgres", tag: "16",
		envVars: []string{"POSTGRES_HOST_AUTH_METHOD=trust", "POSTGRES_DB=test"},
		port:    "5432/tcp",
		url: func(hp string) string {
			return "postgres://postgres@" + hp + "/test?sslmode=disable"
		},
	}
	pgLogicalService = &service{
		env:        EnvPGLogical,
		example:    "$(scripts/pg-logical.sh url), after scripts/pg-logical.sh start",
		repository: "postgres", tag: "16",
		cmd:     []string{"-c", "wal_level=logical", "-c", "max_slot_wal_keep_size=256MB", "-c", "max_replication_slots=32", "-c", "max_wal_senders=32"},
		envVars: []string{"POSTGRES_HOST_AUTH_METHOD=trust", "POSTGRES_DB=test"},
		port:    "5432/tcp",
		url: func(hp string) string {
			return "postgres://postgres@" + hp + "/test?sslmode=disable"
		},
	}
	amqpService = &service{
		env:        EnvAMQP,
		example:    "amqp://guest:guest@127.0.0.1:5672/",
		repository: "rabbitmq", tag: "3.13",
		port: "5672/tcp",
		url:  func(hp string) string { return "amqp://guest:guest@" + hp + "/" },
	}

	mysqlService = &service{
		env: EnvMySQL, example: "mysql://root@127.0.0.1:3306/test",
		repository: "mariadb", tag: "10.11",
		envVars: []string{"MARIADB_ALLOW_EMPTY_ROOT_PASSWORD=1", "MARIADB_DATABASE=test"},
		port:    "3306/tcp",
		url:     func(hp string) string { return "mysql://root@" + hp + "/test" },
	}
	natsService = &service{
		env: EnvNATS, example: "nats://127.0.0.1:4222",
		repository: "nats", tag: "2", cmd: []string{"-js"}, port: "4222/tcp",
		url: func(hp string) string { return "nats://" + hp },
	}
	redisService = &service{
		env: EnvRedis, example: "redis://127.0.0.1:6379/0",
		repository: "redis", tag: "7", port: "6379/tcp",
		url: func(hp string) string { return "redis://" + hp + "/0" },
	}
	kafkaService = &service{
		env: EnvKafka, example: "kafka://127.0.0.1:9092 (go run ./tools/kfake serves one)",
		repository: "apache/kafka", tag: "3.9.0", port: "9092/tcp",
		envVars: []string{"KAFKA_NUM_PARTITIONS=1", "KAFKA_AUTO_CREATE_TOPICS_ENABLE=true"},
		url:     func(hp string) string { return "kafka://" + hp },
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

// AMQPURL returns the URL of a RabbitMQ server for the test.
func AMQPURL(t testing.TB) string { return amqpService.get(t) }

func (s *service) get(t testing.TB) string {
	t.Helper()
	if v := strings.TrimSpace(os.Getenv(s.env)); v != "" {
		return v
	}
	s.once.Do(func() { s.got, s.err = s.startContainer() })
	if s.err == nil {
		return s.got
	}
	msg := fmt.Sprintf("%s is not set and no container could be started (%v): set %s=%s to run this test",
		s.env, s.err, s.env, s.example)
	if os.Getenv("CI") == "true" || os.Getenv("OUTBOXKIT_REQUIRE_SERVICES") != "" {
		t.Fatal("a missing service is a failure here, not a skip (CI=true or OUTBOXKIT_REQUIRE_SERVICES set): " + msg)
	}
	t.Skip(msg)
	return ""
}

var (
	dockerOnce sync.Once
	dockerPool *dockertest.Pool
	dockerErr  error
)

func (s *service) startContainer() (string, error) {
	dockerOnce.Do(func() {
		dockerPool, dockerErr = dockertest.NewPool("")
		if dockerErr == nil {
			dockerErr = dockerPool.Client.Ping()
		}
		if dockerErr != nil {
			dockerErr = fmt.Errorf("no Docker engine answers: %w", dockerErr)
		}
	})
	if dockerErr != nil {
		return "", dockerErr
	}
	res, err := dockerPool.RunWithOptions(&dockertest.RunOptions{
		Repository: s.repository, Tag: s.tag, Env: s.envVars, Cmd: s.cmd,
	}, func(hc *docker.HostConfig) {
		hc.AutoRemove = true
		hc.RestartPolicy = docker.RestartPolicy{Name: "no"}
	})
	if err != nil {
		return "", fmt.Errorf("start %s:%s: %w", s.repository, s.tag, err)
	}
	// The container outlives no test run by much: Docker removes it when it expires.
	_ = res.Expire(uint(30 * time.Minute / time.Second))
	url := s.url(res.GetHostPort(s.port))
	dockerPool.MaxWait = 2 * time.Minute
	if err := dockerPool.Retry(func() error { return probe(s, url) }); err != nil {
		_ = dockerPool.Purge(res)
		return "", fmt.Errorf("%s:%s did not become ready: %w", s.repository, s.tag, err)
	}
	return url, nil
}
