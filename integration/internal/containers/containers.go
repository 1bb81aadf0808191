// Package containers starts the services a test asks testenv for, when their variable is unset, in
// Docker containers run with dockertest. It lives in the integration module so that dockertest
// and the Docker client it brings stay out of the library's module graph: the library's package
// tests take the services from the variables alone.
//
// A test package of the integration module that asks testenv for services installs it from its
// TestMain:
//
//	func TestMain(m *testing.M) {
//		testenv.StartContainer = containers.Start
//		os.Exit(m.Run())
//	}
package containers

import (
	"fmt"
	"sync"
	"time"

	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"

	"github.com/outboxkit/outboxkit/internal/testenv"
)

var (
	dockerOnce sync.Once
	dockerPool *dockertest.Pool
	dockerErr  error
)

// Start runs spec's container when a Docker engine answers, and returns the service's URL once
// spec.Ready says it answers, within two minutes.
func Start(spec testenv.ContainerSpec) (string, error) {
	dockerOnce.Do(func() {
		dockerPool, dockerErr = dockertest.NewPool("")
		if dockerErr == nil {
			dockerErr = dockerPool.Client.Ping()
			dockerPool.MaxWait = 2 * time.Minute // set once: services start from parallel tests
		}
		if dockerErr != nil {
			dockerErr = fmt.Errorf("no Docker engine answers: %w", dockerErr)
		}
	})
	if dockerErr != nil {
		return "", dockerErr
	}
	res, err := dockerPool.RunWithOptions(&dockertest.RunOptions{
		Repository: spec.Repository, Tag: spec.Tag, Env: spec.Env, Cmd: spec.Cmd,
	}, func(hc *docker.HostConfig) {
		hc.AutoRemove = true
		hc.RestartPolicy = docker.RestartPolicy{Name: "no"}
	})
	if err != nil {
		return "", fmt.Errorf("start %s:%s: %w", spec.Repository, spec.Tag, err)
	}
	// The container outlives no test run by much: Docker removes it when it expires.
	_ = res.Expire(uint(30 * time.Minute / time.Second))
	url := spec.URL(res.GetHostPort(spec.Port))
	if err := dockerPool.Retry(func() error { return spec.Ready(url) }); err != nil {
		_ = dockerPool.Purge(res)
		return "", fmt.Errorf("%s:%s did not become ready: %w", spec.Repository, spec.Tag, err)
	}
	return url, nil
}
