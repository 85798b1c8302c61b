// Package redistest runs a private redis-server for tests: on a free
// loopback port, with no persistence, stopped when the test ends.
//
// Tests that need Redis fail, never skip, when it cannot start: CI installs
// Debian's redis-server (scripts/test-deps), so a missing server is a broken
// machine, not an optional feature.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/internal/syncbuf"
)

// startTimeout bounds how long Start and Restart wait for PONG.
const startTimeout = 15 * time.Second

// Server is one redis-server process. Its port stays the same across Stop
// and Restart, so clients configured with URL reconnect to the new process.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Start starts redis-server on a free 127.0.0.1 port without persistence
// (no RDB snapshots, no AOF) and waits until it answers PING. The server is
// stopped in t.Cleanup. Start calls t.Fatal when the server cannot start.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if _, serr := os.Stat("/usr/bin/redis-server"); serr != nil {
			t.Fatalf("redistest: redis-server not found (%v): install Debian's redis-server package (make test does, through scripts/test-deps)", err)
		}
		bin = "/usr/bin/redis-server"
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir()}
	t.Cleanup(s.Stop)
	// A port found free can be taken before redis-server binds it; try a
	// few before giving up.
	var lastErr error
	for range 5 {
		if s.port, err = freePort(); err != nil {
			t.Fatalf("redistest: %v", err)
		}
		if lastErr = s.start(); lastErr == nil {
			return s
		}
	}
	t.Fatalf("redistest: %v", lastErr)
	return nil
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL returns the redis:// URL of database 0.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Stop stops the server (SIGTERM, then SIGKILL after 10 s) and waits for it
// to exit. Its data is lost. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Restart starts a new, empty server on the same port after Stop. It calls
// t.Fatal when the server cannot start (the port was taken meanwhile).
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		s.t.Fatalf("redistest: restart: %v", err)
	}
}

// start runs redis-server on s.port and waits for PONG.
func (s *Server) start() error {
	out := &syncbuf.Buffer{}
	cmd := exec.Command(s.bin,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
		"--loglevel", "warning",
	)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	deadline := time.Now().Add(startTimeout)
	for {
		err := ping(s.Addr())
		if err == nil {
			// Another test's server may hold the port (found free, then
			// taken before this one bound it): that one answers PING too,
			// while this one exits with "address in use".
			var pid int
			if pid, err = serverPID(s.Addr()); err == nil && pid != cmd.Process.Pid {
				_ = cmd.Process.Kill()
				<-done
				return fmt.Errorf("port %d is taken by another redis-server (pid %d)", s.port, pid)
			}
		}
		if err == nil {
			break
		}
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited: %s", s.port, strings.TrimSpace(out.String()))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("redis-server on port %d did not answer PING in %s: %v\n%s", s.port, startTimeout, err, out.String())
		}
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	return nil
}

// ping sends PING over a fresh connection and expects +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return errors.New("unexpected answer to PING: " + strings.TrimSpace(line))
	}
	return nil
}

// serverPID asks the server at addr for its process id (INFO server).
func serverPID(addr string) (int, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
		return 0, err
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if !strings.HasPrefix(head, "$") || err != nil {
		return 0, errors.New("unexpected answer to INFO: " + strings.TrimSpace(head))
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("INFO server has no process_id")
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
