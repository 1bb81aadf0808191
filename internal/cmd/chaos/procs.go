package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// logTime stamps each line of a process's log, so that its restarts and faults can be laid beside
// the effects' times.
const logTime = "15:04:05.000"

// proc is one of the soak's processes, restarted whenever it exits until stopped: by a SIGKILL
// of the soak's, or of its own accord (Billing's --crash-after-charge exits with status 3).
type proc struct {
	name     string
	consumer string // the consumer a consumer process runs
	bin      string
	args     []string
	log      *os.File

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	stopped bool
	killing bool

	starts      atomic.Int64
	selfExits   atomic.Int64 // exits the soak did not cause
	fencedExits atomic.Int64 // exits with status exitFenced: a transactional relay another relay of its group fenced
	// marked counts the lines holding each of its markers (set by countLines before start).
	marked      map[string]*atomic.Int64
	faultLines  atomic.Int64 // lines announcing an in-process fault (demo: fault: …, crashing after …)
	lastFailure atomic.Value // string: the last line of a process that exited on its own
	wg          sync.WaitGroup
}

func newProc(dir, name, bin string, args ...string) (*proc, error) {
	log, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	return &proc{name: name, bin: bin, args: args, log: log}, nil
}

// countLines makes the process count the lines of its output that hold each marker (read them
// with lines). Call it before start.
func (p *proc) countLines(markers ...string) {
	if p.marked == nil {
		p.marked = map[string]*atomic.Int64{}
	}
	for _, m := range markers {
		p.marked[m] = new(atomic.Int64)
	}
}

// lines is how many lines held marker, over every run of the process.
func (p *proc) lines(marker string) int64 {
	if n, ok := p.marked[marker]; ok {
		return n.Load()
	}
	return 0
}

// start runs the process and keeps it running: whenever it exits, it is started again after
// restartAfter(), until stop.
func (p *proc) start(restartAfter func() time.Duration) error {
	if err := p.spawn(); err != nil {
		return err
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			p.mu.Lock()
			exited := p.exited
			p.mu.Unlock()
			<-exited
			p.mu.Lock()
			if p.stopped {
				p.mu.Unlock()
				return
			}
			if !p.killing {
				p.selfExits.Add(1)
			}
			p.killing = false
			p.mu.Unlock()
			time.Sleep(restartAfter())
			for {
				p.mu.Lock()
				stopped := p.stopped
				p.mu.Unlock()
				if stopped {
					return
				}
				if err := p.spawn(); err == nil {
					break
				} else {
					fmt.Fprintf(p.log, "chaos: restart %s: %v\n", p.name, err)
					time.Sleep(time.Second)
				}
			}
		}
	}()
	return nil
}

func (p *proc) spawn() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return nil
	}
	cmd := exec.Command(p.bin, p.args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = cmd.Stdout
	fmt.Fprintf(p.log, "%s chaos: start %s %s\n", time.Now().Format(logTime), p.name, strings.Join(p.args, " "))
	if err := cmd.Start(); err != nil {
		return err
	}
	p.starts.Add(1)
	exited := make(chan struct{})
	p.cmd, p.exited = cmd, exited
	go func() {
		p.scan(out)
		err := cmd.Wait()
		if exit := (*exec.ExitError)(nil); errors.As(err, &exit) && exit.ExitCode() == exitFenced {
			p.fencedExits.Add(1)
		}
		fmt.Fprintf(p.log, "%s chaos: %s exited: %v\n", time.Now().Format(logTime), p.name, err)
		close(exited)
	}()
	return nil
}

// scan copies the process's output to its log and counts the faults it announces.
func (p *proc) scan(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(p.log, time.Now().Format(logTime), line)
		if strings.Contains(line, "demo: fault:") || strings.Contains(line, "crashing after charging") {
			p.faultLines.Add(1)
		}
		if strings.HasPrefix(line, "demo: ") && !strings.Contains(line, "fault") {
			p.lastFailure.Store(line)
		}
		for m, n := range p.marked {
			if strings.Contains(line, m) {
				n.Add(1)
			}
		}
	}
}

// kill sends SIGKILL and waits for the process to be gone; the supervisor restarts it. It reports
// whether there was a process to kill: none while a restart is pending.
func (p *proc) kill() bool {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	if p.stopped || cmd == nil || cmd.Process == nil {
		p.mu.Unlock()
		return false
	}
	select {
	case <-exited: // exited already, restart pending
		p.mu.Unlock()
		return false
	default:
	}
	p.killing = true
	_ = cmd.Process.Signal(syscall.SIGKILL)
	p.mu.Unlock()
	<-exited
	return true
}

// stop ends the process for good: SIGTERM, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	p.mu.Lock()
	p.stopped = true
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(grace):
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-exited
		}
	}
	p.wg.Wait()
	_ = p.log.Close()
}
