package testenv

import (
	"bytes"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BinlogServer is the binlog relay's server (EnvMySQLBinlog) as a process a test may crash and
// start again: one that scripts/mariadb-binlog.sh of this repository started, whose data folder
// is .cache/mariadb-binlog/<port>/ of the repository.
type BinlogServer struct {
	script  string // scripts/mariadb-binlog.sh
	port    string
	pidFile string
	killed  bool // by Kill, and not started again since
}

// MySQLBinlogServer returns control of the server at rawURL (MySQLBinlogURL's) when
// scripts/mariadb-binlog.sh of this repository started it, which the server itself says: its
// pid_file is the script's for its port, under the repository's .cache/mariadb-binlog/. Otherwise
// the test is skipped saying how to run it, or fails under CI=true (or OUTBOXKIT_REQUIRE_SERVICES).
// A server the test killed and did not start again is started when the test ends.
func MySQLBinlogServer(t testing.TB, rawURL string) *BinlogServer {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	script := filepath.Join(root, "scripts", "mariadb-binlog.sh")
	how := "start it with MARIADB_BINLOG_PORT=<port> " + script + " start and point " + EnvMySQLBinlog + " at it"
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("parse %s: %v", rawURL, err)
	}
	host, port := u.Hostname(), u.Port()
	if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && host != "localhost" {
		missing(t, "the binlog server "+u.Redacted()+" is not on this machine, so the test cannot kill and start it: "+how)
		return nil
	}
	if port == "" {
		port = "3306"
	}
	var serverPidFile string
	if err := OpenMySQL(t, rawURL).QueryRow("SELECT @@GLOBAL.pid_file").Scan(&serverPidFile); err != nil {
		t.Fatalf("ask the binlog server %s for its pid_file: %v", u.Redacted(), err)
	}
	s := &BinlogServer{script: script, port: port, pidFile: filepath.Join(root, ".cache", "mariadb-binlog", port, "mariadbd.pid")}
	if !samePath(serverPidFile, s.pidFile) {
		missing(t, "the binlog server "+u.Redacted()+" was not started by "+script+" (its pid_file is "+serverPidFile+
			", not "+s.pidFile+"), so the test cannot kill and start it: "+how)
		return nil
	}
	t.Cleanup(func() {
		if s.killed {
			if out, err := s.start(); err != nil {
				t.Errorf("start the binlog server the test killed: %v\n%s", err, out)
			}
		}
	})
	return s
}

func samePath(a, b string) bool {
	ra, errA := filepath.EvalSymlinks(a)
	rb, errB := filepath.EvalSymlinks(b)
	return errA == nil && errB == nil && ra == rb
}

// Kill ends the server with SIGKILL, as a crash of its process would, and returns once the
// process is gone. (A crash of the process, not of the machine: what the server wrote is in the
// operating system's files, whether it synced them or not.)
func (s *BinlogServer) Kill(t testing.TB) {
	t.Helper()
	text, err := os.ReadFile(s.pidFile)
	if err != nil {
		t.Fatalf("read the binlog server's pid file: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(text)))
	if err != nil || pid <= 1 {
		t.Fatalf("the binlog server's pid file %s holds %q, not a process id", s.pidFile, text)
	}
	if cmd, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); err == nil && !bytes.Contains(cmd, []byte("mysqld")) && !bytes.Contains(cmd, []byte("mariadbd")) {
		t.Fatalf("process %d of the binlog server's pid file %s is not a MariaDB or MySQL server (%q): not killing it", pid, s.pidFile, cmd)
	}
	p, err := os.FindProcess(pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(os.Kill); err != nil {
		t.Fatalf("kill the binlog server (pid %d): %v", pid, err)
	}
	s.killed = true
	// Its first thread turns zombie before the others have ended and closed the server's files
	// and sockets: the port is free once they have.
	Eventually(t, 30*time.Second, "the killed binlog server's process to end", func() bool {
		return !alive(p) && !listening("127.0.0.1:"+s.port)
	})
	// The script takes a process of the pid file's id for the server running: one that has not
	// been reaped yet would be taken so.
	_ = os.Remove(s.pidFile)
}

// alive reports whether p runs: it exists and is not a zombie waiting to be reaped.
func alive(p *os.Process) bool {
	if p.Signal(syscall.Signal(0)) != nil {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(p.Pid) + "/stat")
	if err != nil {
		return true // no /proc here: the signal's answer is all there is
	}
	// pid (comm) state …: comm may hold spaces and parentheses, the state follows the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

// listening reports whether a server accepts connections at addr.
func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// Start starts the server again with the script, and returns once it answers.
func (s *BinlogServer) Start(t testing.TB) {
	t.Helper()
	if out, err := s.start(); err != nil {
		t.Fatalf("start the binlog server: %v\n%s", err, out)
	}
}

func (s *BinlogServer) start() ([]byte, error) {
	cmd := exec.Command(s.script, "start")
	cmd.Env = append(os.Environ(), "MARIADB_BINLOG_PORT="+s.port)
	out, err := cmd.CombinedOutput()
	if err == nil {
		s.killed = false
	}
	return out, err
}
