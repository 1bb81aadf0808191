package outboxmsg

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/store"
)

// A UUID repeated within one call is refused naming both messages, in short calls (compared in
// place) and long ones (a map) alike.
func TestRowsRefusesAUUIDRepeatedWithinTheCall(t *testing.T) {
	for _, n := range []int{2, 16, 17, 100} {
		msgs := make([]*message.Message, n)
		for i := range msgs {
			msgs[i] = message.NewMessage(fmt.Sprintf("id-%d", i), nil)
		}
		if _, err := Rows("orders", msgs); err != nil {
			t.Fatalf("%d distinct messages: %v", n, err)
		}
		msgs[n-1] = message.NewMessage("id-0", nil)
		_, err := Rows("orders", msgs)
		var ie *InvalidError
		if !errors.As(err, &ie) || ie.Index != n-1 || !errors.Is(err, store.ErrDuplicateUUID) {
			t.Fatalf("%d messages, the last repeating the first: %v", n, err)
		}
	}
}

func BenchmarkRows(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		msgs := make([]*message.Message, n)
		for i := range msgs {
			msgs[i] = message.NewMessage(fmt.Sprintf("0192e5c4-7b1a-7000-8000-%012d", i), []byte(`{"id":"o-1"}`))
		}
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Rows("orders", msgs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
