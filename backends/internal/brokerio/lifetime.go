package brokerio

import "sync"

// Lifetime is how a subscriber ends: Close may be called any number of times, from any goroutine;
// the first closes Closing, which every subscription watches, waits for every goroutine Enter
// admitted, and then releases what the subscriber holds. No goroutine of the subscriber outlives
// Close, and none is admitted once it has begun. The zero value is ready to use.
type Lifetime struct {
	once    sync.Once
	closing chan struct{}
	mu      sync.Mutex
	closed  bool
	wg      sync.WaitGroup
}

func (l *Lifetime) init() { l.once.Do(func() { l.closing = make(chan struct{}) }) }

// Enter admits the n goroutines of a subscription about to be made; false once Close has begun
// (the subscriber is closed). Each admitted goroutine calls Leave when it ends; a Subscribe that
// fails before starting them calls Leave for each.
func (l *Lifetime) Enter(n int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.wg.Add(n)
	return true
}

// Leave ends an admitted goroutine.
func (l *Lifetime) Leave() { l.wg.Done() }

// Go runs f in a goroutine of its own, admitted: call it only from an admitted goroutine.
func (l *Lifetime) Go(f func()) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f()
	}()
}

// Closing is closed when Close begins.
func (l *Lifetime) Closing() <-chan struct{} {
	l.init()
	return l.closing
}

// Closed reports whether Close has begun.
func (l *Lifetime) Closed() bool {
	select {
	case <-l.Closing():
		return true
	default:
		return false
	}
}

// Close closes Closing, waits for every admitted goroutine, then calls release (when not nil) and
// returns its error. Later calls return nil at once.
func (l *Lifetime) Close(release func() error) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.init()
	close(l.closing)
	l.mu.Unlock()
	l.wg.Wait()
	if release == nil {
		return nil
	}
	return release()
}
