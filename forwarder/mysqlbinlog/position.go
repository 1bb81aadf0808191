package mysqlbinlog

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
)

// Flavors of server, as go-mysql names them.
const (
	flavorMariaDB = gomysql.MariaDBFlavor // "mariadb"
	flavorMySQL   = gomysql.MySQLFlavor   // "mysql"
)

// position is a place in the binary log: the end of a transaction, from which the relay reads on.
// Where progress is tracked by GTIDs, gtid is the set read up to (and file and pos, when known,
// where that is in the log, for an operator); else gtid is "" and file and pos say it.
type position struct {
	gtid string
	file string
	pos  uint32
}

func (p position) String() string {
	switch {
	case p.gtid != "" && p.file != "":
		return fmt.Sprintf("GTID %s (%s:%d)", p.gtid, p.file, p.pos)
	case p.file != "":
		return fmt.Sprintf("%s:%d", p.file, p.pos)
	case p.gtid != "":
		return "GTID " + p.gtid
	default:
		return "the start of the binary log"
	}
}

// gtidSet parses p's GTID set in flavor's syntax: MariaDB's domain-server-seq list
// ("1-1-42,2-7-9"), MySQL's uuid:intervals ("3e11fa47-…:1-42"). An empty one is the start of the
// log.
func (p position) gtidSet(flavor string) (gomysql.GTIDSet, error) {
	s, err := gomysql.ParseGTIDSet(flavor, strings.TrimSpace(p.gtid))
	if err != nil {
		return nil, fmt.Errorf("GTID set %q is not a %s GTID set: %w", p.gtid, flavor, err)
	}
	return s, nil
}

// filePos is p as go-mysql's file and position.
func (p position) filePos() gomysql.Position { return gomysql.Position{Name: p.file, Pos: p.pos} }

// gtidPosition is the GTID set read up to, as transactions' ends pass: the set the checkpoint
// records.
type gtidPosition interface {
	// add takes in the GTID of a transaction read: MariaDB's domain-server-seq, MySQL's uuid:n.
	add(gtid string) error
	String() string
}

func newGTIDPosition(flavor, set string) (gtidPosition, error) {
	if flavor == flavorMariaDB {
		return parseMariaDBPosition(set)
	}
	s, err := gomysql.ParseMysqlGTIDSet(strings.TrimSpace(set))
	if err != nil {
		return nil, fmt.Errorf("GTID set %q is not a MySQL GTID set: %w", set, err)
	}
	return mysqlPosition{s.(*gomysql.MysqlGTIDSet)}, nil
}

// mysqlPosition is MySQL's GTID set: every transaction's uuid:n, in intervals.
type mysqlPosition struct{ set *gomysql.MysqlGTIDSet }

func (p mysqlPosition) add(gtid string) error { return p.set.Update(gtid) }
func (p mysqlPosition) String() string        { return p.set.String() }

// mariaDBPosition is MariaDB's GTID position: per replication domain, the last transaction's
// domain-server-seq (whichever server wrote it: after a failover the domain's next GTIDs carry
// another server_id, and the position holds one GTID per domain). go-mysql's own set keeps one per
// domain and server, which MariaDB refuses as a position.
type mariaDBPosition struct {
	domains map[uint64]string
}

func parseMariaDBPosition(set string) (mariaDBPosition, error) {
	p := mariaDBPosition{domains: map[uint64]string{}}
	for _, g := range strings.Split(set, ",") {
		if g = strings.TrimSpace(g); g != "" {
			if err := p.add(g); err != nil {
				return p, err
			}
		}
	}
	return p, nil
}

func (p mariaDBPosition) add(gtid string) error {
	parts := strings.Split(gtid, "-")
	if len(parts) != 3 {
		return fmt.Errorf("GTID %q is not a MariaDB GTID (domain-server-seq)", gtid)
	}
	for _, part := range parts {
		if _, err := strconv.ParseUint(part, 10, 64); err != nil {
			return fmt.Errorf("GTID %q is not a MariaDB GTID (domain-server-seq)", gtid)
		}
	}
	domain, _ := strconv.ParseUint(parts[0], 10, 32)
	p.domains[domain] = gtid
	return nil
}

func (p mariaDBPosition) String() string {
	domains := make([]uint64, 0, len(p.domains))
	for d := range p.domains {
		domains = append(domains, d)
	}
	slices.Sort(domains)
	gtids := make([]string, len(domains))
	for i, d := range domains {
		gtids[i] = p.domains[d]
	}
	return strings.Join(gtids, ",")
}
