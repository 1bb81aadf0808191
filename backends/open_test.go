package backends_test

import (
	"context"
	"strings"
	"testing"

	"github.com/outboxkit/outboxkit/backends"
)

func TestOpenSaysWhatIsWrong(t *testing.T) {
	for _, c := range []struct{ url, want string }{
		{"nats://127.0.0.1:4222 extra", "space or control character at byte 21"},
		{"nats://127.0.0.1:4222\n", "space or control character"},
		{"amqp://guest:secret@[::1", "not a valid URL"},
		{"127.0.0.1:5672", "has no scheme"},
		{"carrier-pigeon://loft", `scheme "carrier-pigeon" is not supported`},
		{"amqp://guest:guest@127.0.0.1:5672/", `import _ "github.com/outboxkit/outboxkit/backends/amqpbackend"`},
		{"kafka://127.0.0.1:9092", "backends/kafkabackend"},
	} {
		_, err := backends.Open(context.Background(), c.url, backends.Options{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open(%q) = %v; want an error saying %q", c.url, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q): the error shows the password: %v", c.url, err)
		}
	}
}
