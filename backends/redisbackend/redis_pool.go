package redisbackend

import (
	"net/url"

	"github.com/redis/go-redis/v9"
)

// DefaultPoolSize is the connections each client of this backend keeps (a publisher's, and each
// subscriber's), and the most it opens at once, unless the URL sets pool_size or
// max_active_conns. go-redis's own default grows with the CPUs (10 each) and lets the pool open
// more than that when all are busy, which through a black hole (an address that accepts and never
// answers) turned every timed-out command into a new connection.
const DefaultPoolSize = 10

// boundPool caps the connections a client holds and opens, and lets a command give up at its
// context's deadline (the relay's PublishTimeout) rather than at the end of its read timeout and
// retries, holding its connection meanwhile. pool_size and max_active_conns in the URL are kept.
func boundPool(opts *redis.Options, rawURL string) {
	q := url.Values{}
	if u, err := url.Parse(rawURL); err == nil {
		q = u.Query()
	}
	if !q.Has("pool_size") {
		opts.PoolSize = DefaultPoolSize
	}
	if !q.Has("max_active_conns") {
		opts.MaxActiveConns = opts.PoolSize
		if opts.MaxActiveConns == 0 {
			opts.MaxActiveConns = DefaultPoolSize
		}
	}
	opts.ContextTimeoutEnabled = true
}
