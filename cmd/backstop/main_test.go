package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// binPath is the backstop binary built once by TestMain, for the tests that
// must kill a real process.
var binPath string

func TestMain(m *testing.M) {
	// BACKSTOP_TEST_BIN names a binary built beforehand, so that a profiler
	// can resolve its symbols after the run (perf record -a).
	if binPath = os.Getenv("BACKSTOP_TEST_BIN"); binPath != "" {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "backstop-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "backstop")
	build := exec.Command("go", "build", "-o", binPath, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build backstop:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is one test's world: a simulator behind a real HTTP server, a config
// file pointing at it and a database path.
type env struct {
	t      *testing.T
	sim    *sim.Sim
	srv    *httptest.Server
	dir    string
	config string
	db     string
}

type envOpts struct {
	sim      sim.Options
	pageSize int
	// perMinute and window are the configured tariff (defaults match the sim).
	perMinute int
	window    string
	retryMax  int
	// wrap, when set, sits between the client and the simulator.
	wrap func(http.Handler) http.Handler
}

func newEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	s := sim.New(o.sim)
	var h http.Handler = s.Handler()
	if o.wrap != nil {
		h = o.wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	e := &env{t: t, sim: s, srv: srv, dir: t.TempDir()}
	e.db = filepath.Join(e.dir, "mirror.db")
	if o.pageSize == 0 {
		o.pageSize = 20
	}
	if o.window == "" {
		o.window = "1m"
	}
	if o.perMinute == 0 {
		o.perMinute = 100000
	}
	if o.retryMax == 0 {
		o.retryMax = 3
	}
	e.config = filepath.Join(e.dir, "schedules.yaml")
	e.writeConfig(fmt.Sprintf(`source:
  base_url: %s
  api_key: ${BOTIX_API_KEY}
  page_size: %d
  retry_max: %d
  rate_limit: {per_minute: %d, reserve: 5, window: %s}
store:
  path: %s
`, srv.URL, o.pageSize, o.retryMax, o.perMinute, o.window, e.db))
	return e
}

func (e *env) writeConfig(text string) {
	e.t.Helper()
	if err := os.WriteFile(e.config, []byte(text), 0o600); err != nil {
		e.t.Fatal(err)
	}
}

// appendConfig adds extra (more YAML) to the end of e's configuration file.
func (e *env) appendConfig(extra string) {
	e.t.Helper()
	base, err := os.ReadFile(e.config)
	if err != nil {
		e.t.Fatal(err)
	}
	e.writeConfig(string(base) + extra)
}

func (e *env) environ(key string) []string {
	return append(os.Environ(), "BOTIX_API_KEY="+key, "BACKSTOP_CONFIG=")
}

// run drives Main in-process, the way the binary would, and returns the exit
// code and both streams.
func (e *env) run(ctx context.Context, args ...string) (int, string, string) {
	return e.runKey(ctx, e.sim.APIKey(), args...)
}

func (e *env) runKey(ctx context.Context, key string, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	m := &Main{
		Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb,
		LookupEnv: func(k string) (string, bool) {
			switch k {
			case "BOTIX_API_KEY":
				return key, true
			case "BACKSTOP_CONFIG":
				return "", false
			}
			return os.LookupEnv(k)
		},
	}
	code := m.Run(ctx, append([]string{"--config", e.config}, args...))
	return code, out.String(), errb.String()
}

func (e *env) openStore() *store.DB {
	e.t.Helper()
	db, err := store.Open(context.Background(), e.db, store.Options{})
	if err != nil {
		e.t.Fatal(err)
	}
	return db
}

// assertMirrorEqualsSim compares every object, byte for byte.
func (e *env) assertMirrorEqualsSim(resources ...backstop.Resource) {
	e.t.Helper()
	if len(resources) == 0 {
		resources = backstop.Resources
	}
	db := e.openStore()
	defer db.Close()
	for _, r := range resources {
		want := e.sim.Objects(r)
		got, err := db.Objects(context.Background(), r)
		if err != nil {
			e.t.Fatal(err)
		}
		if len(got) != len(want) {
			e.t.Errorf("%s: mirror has %d objects, platform has %d", r, len(got), len(want))
		}
		byID := make(map[string]backstop.Object, len(got))
		for _, o := range got {
			byID[o.ID] = o
		}
		bad := 0
		for _, w := range want {
			g, ok := byID[w.ID]
			switch {
			case !ok:
				bad++
				if bad <= 3 {
					e.t.Errorf("%s %s: missing from the mirror", r, w.ID)
				}
			case !g.UpdatedAt.Equal(w.UpdatedAt) || !bytes.Equal(g.Data, w.Data):
				bad++
				if bad <= 3 {
					e.t.Errorf("%s %s: mirror has version %s, platform %s", r, w.ID, g.UpdatedAt, w.UpdatedAt)
				}
			}
		}
		if bad > 0 {
			e.t.Errorf("%s: %d of %d objects differ", r, bad, len(want))
		}
	}
}

// assertCursorNotAhead checks, for a platform that did not change, that every
// object at or before each saved cursor's position is in the mirror.
func (e *env) assertCursorNotAhead() {
	e.t.Helper()
	db := e.openStore()
	defer db.Close()
	ctx := context.Background()
	curs, err := db.Cursors(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, c := range curs {
		for _, o := range e.sim.Objects(c.Resource) {
			if o.Position().Compare(c.Position) > 0 {
				break
			}
			got, ok, err := db.Get(ctx, c.Resource, o.ID)
			if err != nil {
				e.t.Fatal(err)
			}
			if !ok || !got.UpdatedAt.Equal(o.UpdatedAt) {
				e.t.Fatalf("%s cursor of %s is at %v, but %s (at or before it) is not in the mirror", c.Kind, c.Resource, c.Position, o.ID)
			}
		}
	}
}

type summary struct {
	Op        string `json:"op"`
	Resources []struct {
		Resource    string `json:"resource"`
		Pages       int    `json:"pages"`
		Objects     int    `json:"objects"`
		New         int    `json:"new"`
		Updated     int    `json:"updated"`
		Emitted     *int   `json:"emitted"`
		Suppressed  *int   `json:"suppressed"`
		Requests    int    `json:"requests"`
		RateLimited int    `json:"rate_limited"`
		Result      string `json:"result"`
		Error       string `json:"error"`
	} `json:"resources"`
}

func parseSummary(t *testing.T, stdout string) summary {
	t.Helper()
	var s summary
	if err := json.Unmarshal([]byte(stdout), &s); err != nil {
		t.Fatalf("summary is not JSON: %v\n%s", err, stdout)
	}
	return s
}

// procHandle is a running backstop process.
type procHandle struct{ cmd *exec.Cmd }

// startBinaryEnv runs the real binary with env; see startBinary.
func (e *env) startBinaryEnv(env []string, args ...string) (*procHandle, <-chan string) {
	cmd, lines := e.startBinaryWith(env, args...)
	return &procHandle{cmd: cmd}, lines
}

// startBinary runs the real binary; lines of its stderr arrive on the
// returned channel (closed at EOF).
func (e *env) startBinary(args ...string) (*exec.Cmd, <-chan string) {
	return e.startBinaryWith(e.environ(e.sim.APIKey()), args...)
}

func (e *env) startBinaryWith(env []string, args ...string) (*exec.Cmd, <-chan string) {
	e.t.Helper()
	cmd := exec.Command(binPath, append([]string{"--config", e.config}, args...)...)
	cmd.Env = env
	stderr, err := cmd.StderrPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		// A test that failed half-way leaves no process behind.
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return cmd, lines
}

// waitLines waits for n lines containing substr, or fails after the deadline.
func waitLines(t *testing.T, lines <-chan string, substr string, n int, deadline time.Duration) {
	t.Helper()
	timeout := time.After(deadline)
	seen := 0
	for seen < n {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("process ended after %d of %d %q lines", seen, n, substr)
			}
			if strings.Contains(l, substr) {
				seen++
			}
		case <-timeout:
			t.Fatalf("saw %d of %d %q lines in %s", seen, n, substr, deadline)
		}
	}
}
