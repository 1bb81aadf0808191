package urls

import "testing"

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"amqp://guest:secret@127.0.0.1:5672/": "amqp://guest:***@127.0.0.1:5672/",
		"postgres://u:p%40ss@h:5432/db?x=1":   "postgres://u:***@h:5432/db?x=1",
		"amqp://guest:secret@[::1":            "amqp://guest:***@[::1",
		"nats://127.0.0.1:4222":               "nats://127.0.0.1:4222",
		"redis://:secret@127.0.0.1:6379/0":    "redis://:***@127.0.0.1:6379/0",
		"mysql://root@127.0.0.1:3306/test":    "mysql://root@127.0.0.1:3306/test",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDialect(t *testing.T) {
	for raw, want := range map[string]string{
		"postgres://u@h/db": "postgres", "POSTGRESQL://h/db": "postgres", "mysql://root@h:3306/test": "mysql",
		"sqlite://x.db": "", "x.db": "", "": "",
	} {
		if got := Dialect(raw); got != want {
			t.Errorf("Dialect(%q) = %q, want %q", raw, got, want)
		}
	}
}
