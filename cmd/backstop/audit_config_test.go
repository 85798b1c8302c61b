package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runBinary runs the real binary in dir with args and extra environment
// (BACKSTOP_CONFIG cleared), and returns its exit code and both streams.
func runBinary(t *testing.T, dir string, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "BACKSTOP_CONFIG="), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("run %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	return code, out.String(), errb.String()
}

// TestBaseURLTheClientCannotUseIsAConfigError: a source.base_url with
// credentials, a query, a fragment or a port out of range used to pass the
// configuration check, and then either failed without naming the file, line
// and key ("source: sources: base URL …") or, for the port, retried a
// connection that could never be made. Each is now a configuration error
// that names them (exit 2), and never repeats a password.
func TestBaseURLTheClientCannotUseIsAConfigError(t *testing.T) {
	dir := t.TempDir()
	cases := []struct{ url, want string }{
		{"http://user:s3cret@127.0.0.1:1", "credentials"},
		{"http://127.0.0.1:1/?tenant=a", "a query"},
		{"http://127.0.0.1:1/#top", "a fragment"},
		{"http://127.0.0.1:99999", `want a port number 0..65535, got "99999"`},
	}
	for _, c := range cases {
		t.Run(c.url, func(t *testing.T) {
			cfg := "source:\n  base_url: \"" + c.url + "\"\n  api_key: k\nstore:\n  path: ./b.db\n"
			if err := os.WriteFile(filepath.Join(dir, "schedules.yaml"), []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			code, _, stderr := runBinary(t, dir, nil, "sync")
			if code != exitUsage {
				t.Fatalf("exit %d, want 2\n%s", code, stderr)
			}
			if !strings.Contains(stderr, "backstop: ./schedules.yaml:2: source.base_url: ") || !strings.Contains(stderr, c.want) {
				t.Errorf("stderr does not name file, line, key and %q:\n%s", c.want, stderr)
			}
			if strings.Contains(stderr, "s3cret") {
				t.Errorf("the error repeats the password:\n%s", stderr)
			}
		})
	}
}
