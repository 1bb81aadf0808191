package mysqlbinlog

import (
	"errors"
	"strings"
	"testing"

	"github.com/go-mysql-org/go-mysql/replication"
)

// Each setting the relay cannot work with is refused with the fix. The binary log cannot be
// turned off at runtime, so its refusal is tested here, on the settings as read.
func TestCheckSettingsNamesTheFix(t *testing.T) {
	good := settings{logBin: true, format: "ROW", rowImage: "FULL", serverID: 1, flavor: flavorMariaDB}
	if err := checkSettings(good, 7); err != nil {
		t.Fatalf("a server with the binary log in ROW format, FULL images: %v", err)
	}
	for _, c := range []struct {
		name  string
		alter func(*settings)
		wants []string
	}{
		{"binary log off", func(s *settings) { s.logBin = false }, []string{"binary log is off", "log_bin", "forwarder.Run"}},
		{"statement format", func(s *settings) { s.format = "STATEMENT" }, []string{"binlog_format = STATEMENT", "SET GLOBAL binlog_format = 'ROW'"}},
		{"minimal images", func(s *settings) { s.rowImage = "MINIMAL" }, []string{"binlog_row_image = MINIMAL", "SET GLOBAL binlog_row_image = 'FULL'"}},
		{"the server's server_id", func(s *settings) { s.serverID = 7 }, []string{"ServerID 7 is the server's own server_id", "Config.ServerID"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := good
			c.alter(&s)
			err := checkSettings(s, 7)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range c.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
		})
	}
}

// MariaDB's position holds one GTID per domain, the last one read, whichever server wrote it.
func TestMariaDBPositionKeepsTheLastGTIDOfEachDomain(t *testing.T) {
	p, err := parseMariaDBPosition("1-1-10,0-3-4")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{"1-1-11", "1-2-12", "2-5-1"} { // 1-2-12: the domain's writer changed (a failover)
		if err := p.add(g); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := p.String(), "0-3-4,1-2-12,2-5-1"; got != want {
		t.Fatalf("position %s, want %s", got, want)
	}
	if err := p.add("1-x-3"); err == nil {
		t.Fatal("a GTID that does not parse was taken")
	}
	if empty, err := parseMariaDBPosition(""); err != nil || empty.String() != "" {
		t.Fatalf("the empty position: %q, %v", empty.String(), err)
	}
}

// MySQL's set gains each transaction's GTID in its intervals.
func TestMySQLPositionAddsToTheSet(t *testing.T) {
	const sid = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
	p, err := newGTIDPosition(flavorMySQL, sid+":1-5")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{sid + ":6", sid + ":7"} {
		if err := p.add(g); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := p.String(), sid+":1-7"; got != want {
		t.Fatalf("set %s, want %s", got, want)
	}
}

// An outbox row written as a statement is recognised through the comment outboxkit's statements
// begin with; other statements are not refused.
func TestStatementWritesOfTheOutboxAreRefused(t *testing.T) {
	r := &Relay{database: "shop"}
	for q, refused := range map[string]bool{
		"-- One outbox row; …\n-- ?1 uuid\nINSERT INTO `shop`.outbox (uuid) VALUES ('a')": true,
		"/* a hint */ insert into outbox (uuid) values ('a')":                             true,
		"INSERT INTO `other`.outbox (uuid) VALUES ('a')":                                  false,
		"INSERT INTO `shop`.orders (id) VALUES (1)":                                       false,
		"UPDATE `shop`.outbox SET attempts = 1":                                           false,
	} {
		e := &replication.QueryEvent{Query: []byte(q)}
		if q == "/* a hint */ insert into outbox (uuid) values ('a')" {
			e.Schema = []byte("shop")
		}
		err := r.statementWrite(e)
		if (err != nil) != refused {
			t.Errorf("%q: %v, want refused %v", q, err, refused)
		}
		if err != nil && !isFatal(err) {
			t.Errorf("%q: the refusal is not fatal: %v", q, err)
		}
	}
}

// A row image without a column the relay needs is a missing-column error, which stops the relay.
func TestAnImageWithoutAColumnIsRefused(t *testing.T) {
	m, err := mapColumns([]string{"seq", "uuid", "topic", "partition_key", "payload", "metadata", "created_at",
		"published_at", "attempts", "next_attempt_at", "dead_lettered_at", "last_error"})
	if err != nil {
		t.Fatal(err)
	}
	image := []any{int64(1), "id", "orders", nil, []byte("p"), []byte("{}"), "2026-01-02 03:04:05.000006", nil, int32(0), nil, nil, nil}
	o, err := decodeImage(m, image, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.row.Seq != 1 || o.row.UUID != "id" || o.row.PartitionKey != "" || o.row.CreatedAt.Nanosecond() != 6000 || o.published || o.deadLettered {
		t.Fatalf("decoded %+v", o)
	}
	bitmap := []byte{0xff, 0x0f &^ 1} // columns 0–11 present but attempts (column 8: bit 0 of byte 1)
	_, err = decodeImage(m, image, bitmap)
	var mc errMissingColumn
	if !errors.As(err, &mc) || string(mc) != "attempts" {
		t.Fatalf("an image without attempts: %v", err)
	}
	if !isFatal(asFatal(err)) || !strings.Contains(err.Error(), "binlog_row_image") {
		t.Fatalf("the refusal %v is not fatal or does not name binlog_row_image", err)
	}
}
