package brokerio

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
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
	go func() {
		defer l.Leave()
		<-l.Closing()
		l.Go(func() { time.Sleep(50 * time.Millisecond); ended.Store(true) }) // a settling goroutine, admitted
	}()
	var released atomic.Int32
	boom := errors.New("boom")
	if err := l.Close(func() error { released.Add(1); return boom }); !errors.Is(err, boom) {
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
