package testenv

import (
	"bufio"
	"os"
	"os/exec"
	"testing"
	"time"
)

// StartHelperProcess runs this test binary again as a child process running only the test named
// run (its body reads env to know it is the child), with env added to this process's, and
// returns it once the child printed the line ready on its standard output — within 30 s, else the
// test fails. The child's standard error is this process's. The child is killed at the test's end
// if it still runs; a test kills it earlier (SIGKILL, to play a crash) through the returned
// command.
func StartHelperProcess(t testing.TB, run string, env []string, ready string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	seen := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == ready {
				close(seen)
				break
			}
		}
		for sc.Scan() { // keep the pipe read until the child ends
		}
	}()
	select {
	case <-seen:
	case <-time.After(30 * time.Second):
		t.Fatalf("the helper process %s did not print %q within 30s", run, ready)
	}
	return cmd
}
