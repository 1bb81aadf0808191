package brokerio

import (
	"errors"
	"sync/atomic"
	"testing"
)

func TestLifetime(t *testing.T) {
	var l Lifetime
	if l.Closed() {
		t.Fatal("a new Lifetime says it is closed")
	}
	if !l.Enter(2) {
		t.Fatal("Enter refused before Close")
	}
	l.Leave() // a goroutine that never started
	var ended atomic.Bool
	unblock := make(chan struct{})
	go func() {
		defer l.Leave()
		<-l.Closing()
		l.Go(func() { <-unblock; ended.Store(true) }) // a settling goroutine, admitted
	}()
	var released atomic.Int32
	boom := errors.New("boom")
	closed := make(chan error, 1)
	go func() { closed <- l.Close(func() error { released.Add(1); return boom }) }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while an admitted goroutine still ran", err)
	default:
	}
	close(unblock)
	if err := <-closed; !errors.Is(err, boom) {
		t.Fatalf("Close = %v, want the release's error", err)
	}
	if !ended.Load() {
		t.Fatal("Close returned before an admitted goroutine ended")
	}
	if err := l.Close(func() error { released.Add(1); return nil }); err != nil || released.Load() != 1 {
		t.Fatalf("second Close = %v, %d releases; want nil and one release", err, released.Load())
	}
	if !l.Closed() || l.Enter(1) {
		t.Fatal("a closed Lifetime admits a subscription")
	}
}
