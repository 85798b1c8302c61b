package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sources/sim"
)

// `backstop run JOB` stopped with SIGTERM exits 130, prints the result
// interrupted and stores it so (as sync and backfill report it), not as
// failed: an interrupted run is not a failure of the job.
func TestRunJobInterruptedIsStoredAsInterrupted(t *testing.T) {
	e := newEnv(t, envOpts{
		sim:       sim.Options{Seed: 13, Objects: 1500, Limit: 60, Window: time.Second},
		perMinute: 3600, window: "1s", pageSize: 10,
	})
	e.withJobs()
	var stdout bytes.Buffer
	cmd, lines := startRunJob(t, e, &stdout)
	var tail []string
	waitLines(t, lines, "page committed", 3, time.Minute)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for l := range lines {
		tail = append(tail, l)
	}
	cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != exitInterrupted {
		t.Fatalf("run after SIGTERM: exit %d, want 130\n%s", code, strings.Join(tail, "\n"))
	}
	if !strings.Contains(stdout.String(), "interrupted") || strings.Contains(stdout.String(), "failed") {
		t.Errorf("run printed, want result interrupted:\n%s", stdout.String())
	}
	db := e.openStore()
	defer db.Close()
	runs, err := db.JobRuns(context.Background(), "crm-nightly", 0)
	if err != nil || len(runs) != 1 || runs[0].Status != "interrupted" || runs[0].Counts.Pages == 0 {
		t.Fatalf("stored runs %+v (err %v), want one interrupted run with its pages", runs, err)
	}
	// The next run completes from the saved cursor.
	if code, _, stderr := e.run(context.Background(), "run", "crm-nightly"); code != exitOK {
		t.Fatalf("next run: exit %d\n%s", code, stderr)
	}
}

// Two runs of one job overlapping without Redis (a slow cron run still
// going when the next one starts, or serve's schedule and a run by hand):
// both used to run in full. The second now sees the first's run going on
// in the store, is skipped (exit 75, as with Redis) and says which run
// holds the job.
func TestRunJobOverlappingWithoutRedisIsSkipped(t *testing.T) {
	e := newEnv(t, envOpts{
		sim:       sim.Options{Seed: 14, Objects: 1500, Limit: 60, Window: time.Second},
		perMinute: 3600, window: "1s", pageSize: 10,
	})
	e.withJobs()
	cmd, lines := startRunJob(t, e, nil)
	waitLines(t, lines, "page committed", 1, time.Minute)

	code, stdout, errOut := e.run(context.Background(), "run", "crm-nightly")
	if code != exitBusy || !strings.Contains(stdout, "skipped") ||
		!strings.Contains(errOut, "in another process") || !strings.Contains(errOut, "run 1,") {
		t.Errorf("a second run while the first goes on: exit %d\n%s%s\nwant skipped, naming run 1", code, stdout, errOut)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for range lines {
	}
	cmd.Wait()
	db := e.openStore()
	defer db.Close()
	runs, err := db.JobRuns(context.Background(), "crm-nightly", 0)
	if err != nil {
		t.Fatal(err)
	}
	statuses := map[string]int{}
	for _, r := range runs {
		statuses[r.Status]++
	}
	if statuses["skipped"] != 1 || statuses["interrupted"] != 1 || len(runs) != 2 {
		t.Errorf("stored runs %v, want the first interrupted and the second skipped", statuses)
	}
}

// startRunJob starts `backstop run crm-nightly` (debug logs) on e's
// configuration, its stdout into stdout (when not nil), and returns it
// with its stderr's lines; it is killed at cleanup if still running.
func startRunJob(t *testing.T, e *env, stdout io.Writer) (*exec.Cmd, chan string) {
	t.Helper()
	cmd := exec.Command(binPath, "--config", e.config, "--log-level", "debug", "run", "crm-nightly")
	cmd.Env = e.environ(e.sim.APIKey())
	cmd.Stdout = stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return cmd, lines
}
