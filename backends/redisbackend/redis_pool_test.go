package redisbackend

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestBoundPoolCapsConnectionsUnlessTheURLSaysOtherwise(t *testing.T) {
	for _, tc := range []struct {
		url                  string
		poolSize, maxActive  int
		contextTimeoutHonour bool
	}{
		{"redis://127.0.0.1:6379/0", DefaultPoolSize, DefaultPoolSize, true},
		{"redis://127.0.0.1:6379/0?pool_size=40", 40, 40, true},
		{"redis://127.0.0.1:6379/0?pool_size=40&max_active_conns=50", 40, 50, true},
	} {
		opts, err := redis.ParseURL(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		boundPool(opts, tc.url)
		if opts.PoolSize != tc.poolSize || opts.MaxActiveConns != tc.maxActive || opts.ContextTimeoutEnabled != tc.contextTimeoutHonour {
			t.Errorf("%s: pool %d, max active %d, context timeouts %v; want %d, %d, %v", tc.url,
				opts.PoolSize, opts.MaxActiveConns, opts.ContextTimeoutEnabled, tc.poolSize, tc.maxActive, tc.contextTimeoutHonour)
		}
	}
}

func TestClientsEachKeepWhatTheURLSays(t *testing.T) {
	opts, err := redis.ParseURL("redis://127.0.0.1:6379/0?max_retries=-1&read_timeout=-1")
	if err != nil {
		t.Fatal(err)
	}
	newClient := clients(opts)
	for i := 0; i < 3; i++ {
		c := newClient()
		if o := c.Options(); o.MaxRetries != 0 || o.ReadTimeout != 0 {
			t.Errorf("client %d: max retries %d, read timeout %s; want none (0) and none, as the URL says", i, o.MaxRetries, o.ReadTimeout)
		}
		_ = c.Close()
	}
}
