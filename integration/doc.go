// Package integration holds the failure-matrix tests: each provokes a fault on purpose against a
// real Postgres and a real broker and pins what happens next.
//
// Services come from OUTBOXKIT_TEST_POSTGRES_URL and OUTBOXKIT_TEST_AMQP_URL, or from containers
// started with dockertest when a Docker engine answers; otherwise the tests skip, naming the
// variable to set — except under CI=true, where a missing service fails the run.
package integration
