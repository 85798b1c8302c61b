package main

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// A serve killed with SIGKILL while a job runs, and restarted at once,
// runs the job: its run left "running", with a fresh heartbeat, is closed
// as abandoned (its process is gone from this host) and a new run goes
// to its end. It used to be taken for a run going on in another process
// for three minutes after its last heartbeat: the restarted serve skipped
// the job, and a job on an interval (here an overdue hourly one) then
// waited a whole interval.
func TestServeRestartedAfterAKillRunsTheJobAgain(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	// The first serve's run is held at its first request until it is killed:
	// a run that ends before the kill is impossible, however loaded the box.
	gate := make(chan struct{})
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 19, Objects: 300}, wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
			h.ServeHTTP(w, r)
		})
	}})
	e.writeServeConfig(addr, `jobs:
  - {name: hourly, kind: sync, resources: [contacts], every: 1h}
`)
	ctx := context.Background()
	db := e.openStore()
	defer db.Close()
	// The job last ran two hours ago: serve runs it as soon as it starts.
	ago := time.Now().Add(-2 * time.Hour)
	if _, err := db.SaveJobRun(ctx, store.JobRun{Job: "hourly", Kind: "sync", Status: "ok",
		StartedAt: ago, FinishedAt: ago.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	runs := func() []store.JobRun {
		t.Helper()
		rs, err := db.JobRuns(ctx, "hourly", 0)
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	// await polls the job's runs until cond holds of them.
	await := func(p *fleetProc, what string, within time.Duration, cond func([]store.JobRun) bool) []store.JobRun {
		t.Helper()
		deadline := time.Now().Add(within)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			rs := runs()
			if cond(rs) {
				return rs
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s within %s; runs %+v\n%s:\n%s", what, within, rs, p.name, p.output())
			}
			<-tick.C
		}
	}
	env := []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}

	first := startProc(t, "serve", e.config, e.sim.APIKey(), env, "serve")
	rs := await(first, "running run", 20*time.Second, func(rs []store.JobRun) bool {
		return len(rs) > 0 && rs[0].Status == "running"
	})
	killed := rs[0].ID
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.wait(10 * time.Second)
	close(gate)
	if r := runs()[0]; r.ID != killed || r.Status != "running" {
		t.Fatalf("after the kill the newest run is %+v, want run %d left running", r, killed)
	}

	again := startProc(t, "serve (restarted)", e.config, e.sim.APIKey(), env, "serve")
	rs = await(again, "run to its end after the restart", 20*time.Second, func(rs []store.JobRun) bool {
		return len(rs) > 0 && rs[0].ID > killed && rs[0].Status == "ok"
	})
	for _, r := range rs {
		switch {
		case r.ID == killed:
			if r.Status != "abandoned" || !strings.Contains(r.Error, "is gone") {
				t.Errorf("the killed run: %+v, want abandoned as its process is gone", r)
			}
		case r.ID > killed && r.Status == "skipped":
			t.Errorf("the restarted serve skipped the job: %+v", r)
		}
	}
	if n := again.count("job still running"); n != 0 {
		t.Errorf("the restarted serve logged %d skips:\n%s", n, again.output())
	}
}
