// Package integration holds the failure-matrix tests: each provokes a fault on purpose against a
// real Postgres and a real broker and pins what happens next.
//
// Services come from OUTBOXKIT_TEST_POSTGRES_URL, OUTBOXKIT_TEST_AMQP_URL and the other variables
// internal/testenv names, or from containers started with dockertest when a Docker engine answers
// (integration/internal/containers, which TestMain installs: the library's own package tests have
// no such fallback); otherwise the tests skip, naming the variable to set — except under CI=true,
// where a missing service fails the run.
//
// This directory is a module of its own (see go.mod), in one workspace with the library (go.work):
// what only tests need — dockertest, chromedp, kfake, Watermill's Pub/Sub suite — is required here
// and never by the library's go.mod, so it is in no user's module graph. Besides the failure matrix
// it holds the tests of library packages that need such a dependency: integration/console (the
// console's pages in headless Chromium), this package's TestConsoleInTheDemo (the demo binary's
// console, likewise) and integration/kafkabackend (TLS and SASL against an in-process kfake).
package integration
