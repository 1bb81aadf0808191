package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outboxkit/backends/amqpbackend"
	"github.com/outboxkit/outboxkit/fleet"
	"github.com/outboxkit/outboxkit/fleet/fleetstores"
	"github.com/outboxkit/outboxkit/forwarder"
	"github.com/outboxkit/outboxkit/store"
)

// fleetChildEnv, set, makes the bench a relay process of the fleet scenario instead: the idle
// part measures the CPU and memory of a process that runs nothing else. Its value is a
// fleetChildSpec in JSON.
const fleetChildEnv = "OUTBOXKIT_BENCH_FLEET_CHILD"

// fleetChildSpec is what a relay process of the fleet scenario runs.
type fleetChildSpec struct {
	// Kind is "member" (one fleet member, fleetstores.Opener, a TableCatalog) or "forwarders" (a
	// stock forwarder per schema, each on a store of its own: store.Open, MaxConns 1, its own
	// LISTEN connection).
	Kind   string `json:"kind"`
	URL    string `json:"url"` // the bench's database, with the process's application_name
	Broker string `json:"broker"`
	// member
	Fleet   string `json:"fleet,omitempty"`
	Catalog string `json:"catalog,omitempty"` // the TableCatalog query
	Want    int    `json:"want,omitempty"`    // the outboxes it must own before it is ready
	// forwarders
	Schemas []string `json:"schemas,omitempty"`
}

// childStats is what a relay process reports of itself when asked.
type childStats struct {
	CPU        time.Duration `json:"cpu_ns"` // user and system, since it started
	RSSKB      int64         `json:"rss_kb"`
	HeapAlloc  uint64        `json:"heap_alloc"` // after a GC when asked with "gc": the live heap
	Goroutines int           `json:"goroutines"`
	Owned      int           `json:"owned"`
}

// runFleetChild is main for a relay process: it starts the relays, says "ready" on stdout once
// they run, answers "stats" and "gc" on stdin with a "stats {json}" line, and stops on SIGTERM or
// when stdin closes.
func runFleetChild(raw string) int {
	var spec fleetChildSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %s is not a relay process's spec: %v\n", fleetChildEnv, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := spec.run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "bench: relay process:", err)
		return 1
	}
	return 0
}

func (s fleetChildSpec) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pub, err := amqpbackend.NewPublisher(amqpbackend.PublisherConfig{URL: s.Broker})
	if err != nil {
		return err
	}
	defer pub.Close()
	var (
		runs    []func(context.Context) error
		ready   func() bool
		owned   func() int
		closers []func() error
	)
	defer func() {
		for _, c := range closers {
			_ = c()
		}
	}()
	switch s.Kind {
	case "member":
		m, closeAll, err := s.member(ctx, pub)
		closers = append(closers, closeAll...)
		if err != nil {
			return err
		}
		runs = append(runs, m.Run)
		owned = func() int { return len(m.Owned()) }
		ready = func() bool { return owned() >= s.Want }
	case "forwarders":
		var fs []*forwarder.Forwarder
		for _, schema := range s.Schemas {
			db, err := store.Open(ctx, s.URL, store.OpenOptions{Schema: schema, MaxConns: 1})
			if err != nil {
				return err
			}
			closers = append(closers, db.Close)
			f, err := forwarder.New(forwarder.Config{Store: db, Publisher: pub, Name: "bench"})
			if err != nil {
				return err
			}
			fs = append(fs, f)
			runs = append(runs, f.Run)
		}
		owned = func() int { return len(fs) }
		ready = func() bool {
			for _, f := range fs {
				select {
				case <-f.Running():
				default:
					return false
				}
			}
			return true
		}
	default:
		return fmt.Errorf("kind %q: use member or forwarders", s.Kind)
	}

	var wg sync.WaitGroup
	errs := make([]error, len(runs))
	for i, run := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = run(ctx); errs[i] != nil && ctx.Err() == nil {
				fmt.Fprintln(os.Stderr, "bench: relay process: a relay stopped:", errs[i])
			}
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	deadline := time.Now().Add(3 * time.Minute)
	for !ready() {
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of its outboxes relayed within 3 minutes", owned())
		}
		if !sleepCtx(ctx, 50*time.Millisecond) {
			return nil
		}
	}
	fmt.Println("ready")
	commands := bufio.NewScanner(os.Stdin)
	for commands.Scan() {
		cmd := strings.TrimSpace(commands.Text())
		if cmd != "stats" && cmd != "gc" {
			return fmt.Errorf("unknown command %q: use stats or gc", cmd)
		}
		out, _ := json.Marshal(selfStats(cmd == "gc", owned()))
		fmt.Printf("stats %s\n", out)
	}
	return nil // stdin closed, or SIGTERM (which stops the scanner only when stdin closes too: the parent closes it)
}

// member builds the fleet member and what must be closed after it.
func (s fleetChildSpec) member(ctx context.Context, pub message.Publisher) (*fleet.Member, []func() error, error) {
	var closers []func() error
	coord, err := store.Open(ctx, s.URL, store.OpenOptions{Schema: fleetCoordSchema, PollOnly: true})
	if err != nil {
		return nil, nil, err
	}
	closers = append(closers, coord.Close)
	catalogDB, err := sql.Open("pgx", s.URL)
	if err != nil {
		return nil, closers, err
	}
	closers = append(closers, catalogDB.Close)
	m, err := fleet.New(fleet.Config{Fleet: s.Fleet, Coordination: coord, Catalog: fleet.TableCatalog(catalogDB, s.Catalog),
		Open: fleetstores.Opener(), Publisher: pub})
	return m, closers, err
}

// selfStats reads this process's CPU time, RSS and heap, after a GC when gc is set.
func selfStats(gc bool, owned int) childStats {
	if gc {
		runtime.GC()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	status, _ := os.ReadFile("/proc/self/status")
	rss, _ := parseVMRSS(string(status))
	return childStats{CPU: selfCPU(), RSSKB: rss, HeapAlloc: ms.HeapAlloc, Goroutines: runtime.NumGoroutine(), Owned: owned}
}

// parseVMRSS reads the resident set size, in kB, from the text of /proc/<pid>/status.
func parseVMRSS(status string) (int64, bool) {
	for _, line := range strings.Split(status, "\n") {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, false
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		return n, err == nil
	}
	return 0, false
}

// fleetChild is a relay process the bench started: the bench executable run again with
// fleetChildEnv set. It dies with the bench (fleetChildAttr).
type fleetChild struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // its stdout, a line at a time; closed when it closes
	exited chan struct{}
	err    error // why it exited, once exited is closed
}

func startFleetChild(spec fleetChildSpec) (*fleetChild, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	raw, _ := json.Marshal(spec)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), fleetChildEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = fleetChildAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start a relay process: %w", err)
	}
	c := &fleetChild{cmd: cmd, stdin: stdin, lines: make(chan string, 16), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		c.err = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

// line waits for the process's next line of output, for at most within.
func (c *fleetChild) line(within time.Duration) (string, error) {
	select {
	case l, ok := <-c.lines:
		if !ok {
			<-c.exited
			return "", fmt.Errorf("the relay process exited: %v", c.err)
		}
		return l, nil
	case <-time.After(within):
		return "", fmt.Errorf("the relay process said nothing within %s", within)
	}
}

// ready waits until the process relays all its outboxes.
func (c *fleetChild) ready() error {
	l, err := c.line(4 * time.Minute)
	if err == nil && l != "ready" {
		err = fmt.Errorf("the relay process said %q, not ready", l)
	}
	return err
}

// stats asks the process for its figures (after a GC when gc is set).
func (c *fleetChild) stats(gc bool) (childStats, error) {
	cmd := "stats\n"
	if gc {
		cmd = "gc\n"
	}
	if _, err := io.WriteString(c.stdin, cmd); err != nil {
		return childStats{}, fmt.Errorf("ask the relay process: %w", err)
	}
	l, err := c.line(30 * time.Second)
	if err != nil {
		return childStats{}, err
	}
	var s childStats
	raw, ok := strings.CutPrefix(l, "stats ")
	if !ok {
		return childStats{}, fmt.Errorf("the relay process said %q, not its stats", l)
	}
	return s, json.Unmarshal([]byte(raw), &s)
}

// stop stops the process (SIGTERM, its stdin closed) and waits for it to exit, for at most 30s;
// then it is killed.
func (c *fleetChild) stop() error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	_ = c.stdin.Close()
	go func() {
		for range c.lines { // drain what it still says
		}
	}()
	select {
	case <-c.exited:
		var exit *exec.ExitError
		if errors.As(c.err, &exit) {
			return fmt.Errorf("the relay process: %w", c.err)
		}
		return nil
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
		return errors.New("the relay process did not stop within 30s of SIGTERM: killed")
	}
}
