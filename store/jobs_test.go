package store

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
)

func TestJobRunsSaveListPrune(t *testing.T) {
	db, clk := openTest(t)
	ctx := context.Background()
	if _, err := db.SaveJobRun(ctx, JobRun{Job: "a", Kind: "sync", Status: "running"}); err == nil {
		t.Error("status running accepted")
	}
	if _, err := db.SaveJobRun(ctx, JobRun{Kind: "sync", Status: "ok"}); err == nil {
		t.Error("empty job name accepted")
	}
	if _, ok, err := db.LastJobRun(ctx, "a"); ok || err != nil {
		t.Fatalf("LastJobRun of a job that never ran: ok=%v err=%v", ok, err)
	}
	old := JobRun{Job: "a", Kind: "sync", StartedAt: t0.Add(-40 * 24 * time.Hour), FinishedAt: t0.Add(-40 * 24 * time.Hour),
		Status: "failed", Error: "boom"}
	if _, err := db.SaveJobRun(ctx, old); err != nil {
		t.Fatal(err)
	}
	want := JobRun{Job: "a", Kind: "sync", StartedAt: t0, FinishedAt: t0.Add(time.Second), Status: "ok",
		Counts: backstop.JobCounts{Pages: 1, Objects: 2, New: 3, Updated: 4, Missing: 5, Behind: 6, Reemitted: 7,
			Suppressed: 8, Pruned: 9, Requests: 10, RateLimited: 11}}
	id, err := db.SaveJobRun(ctx, want)
	if err != nil {
		t.Fatal(err)
	}
	want.ID = id
	clk.Set(t0.Add(time.Minute))
	if _, err := db.SaveJobRun(ctx, JobRun{Job: "b", Kind: "maintenance", Status: "skipped"}); err != nil {
		t.Fatal(err)
	}
	got, ok, err := db.LastJobRun(ctx, "a")
	if err != nil || !ok {
		t.Fatalf("LastJobRun: ok=%v err=%v", ok, err)
	}
	if !got.StartedAt.Equal(want.StartedAt) || !got.FinishedAt.Equal(want.FinishedAt) {
		t.Errorf("times %v %v, want %v %v", got.StartedAt, got.FinishedAt, want.StartedAt, want.FinishedAt)
	}
	got.StartedAt, got.FinishedAt, want.StartedAt, want.FinishedAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	got.HeartbeatAt = time.Time{}
	if got != want {
		t.Errorf("last run %+v, want %+v", got, want)
	}
	b, _, _ := db.LastJobRun(ctx, "b")
	if !b.StartedAt.Equal(t0.Add(time.Minute)) || b.Status != "skipped" {
		t.Errorf("zero StartedAt stored as %v, want now; a job only ever skipped shows its skip (%s)", b.StartedAt, b.Status)
	}
	// Ticks skipped while a long run went on do not hide its outcome.
	clk.Set(t0.Add(2 * time.Minute))
	if _, err := db.SaveJobRun(ctx, JobRun{Job: "a", Kind: "sync", Status: "skipped"}); err != nil {
		t.Fatal(err)
	}
	if got, _, err := db.LastJobRun(ctx, "a"); err != nil || got.ID != id || got.Status != "ok" {
		t.Errorf("LastJobRun after a skipped tick = %+v, %v; want the ok run %d", got, err, id)
	}
	runs, err := db.JobRuns(ctx, "a", 0)
	if err != nil || len(runs) != 3 || runs[2].Error != "boom" {
		t.Fatalf("JobRuns = %+v, %v; want newest first, the old failed one last", runs, err)
	}
	n, err := db.PruneJobRuns(ctx, t0.Add(-30*24*time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("PruneJobRuns = %d, %v; want 1", n, err)
	}
	if runs, _ := db.JobRuns(ctx, "a", 0); len(runs) != 2 || runs[1].ID != id {
		t.Errorf("after prune: %+v", runs)
	}
}

// A job run is stored as running at its start and finished in place;
// `backstop jobs` (LastJobRun) shows it running rather than the ticks
// skipped meanwhile. One left running by a process that died is closed as
// abandoned once its heartbeat is JobRunStaleAfter old: by the next run
// of its job, or by maintenance for every job. A run whose heartbeat is
// younger may be going on in another process and is left alone.
func TestJobRunsRunningAndAbandoned(t *testing.T) {
	db, clk := openTest(t)
	ctx := context.Background()
	last := func(job string) JobRun {
		t.Helper()
		run, ok, err := db.LastJobRun(ctx, job)
		if err != nil || !ok {
			t.Fatalf("LastJobRun(%s): ok=%v err=%v", job, ok, err)
		}
		return run
	}
	killed, err := db.StartJobRun(ctx, JobRun{Job: "nightly", Kind: "sync"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.StartJobRun(ctx, JobRun{Kind: "sync"}); err == nil {
		t.Error("a run without a job name was started")
	}
	clk.Set(t0.Add(time.Minute))
	if _, err := db.SaveJobRun(ctx, JobRun{Job: "nightly", Kind: "sync", Status: "skipped"}); err != nil {
		t.Fatal(err)
	}
	if run := last("nightly"); run.ID != killed || run.Status != "running" || !run.StartedAt.Equal(t0) {
		t.Fatalf("last run of a job whose first run goes on: %+v, want run %d running", run, killed)
	}
	clk.Set(t0.Add(30 * time.Minute))
	if err := db.JobRunHeartbeat(ctx, killed); err != nil {
		t.Fatal(err)
	}
	if run := last("nightly"); !run.HeartbeatAt.Equal(t0.Add(30*time.Minute)) || !run.FinishedAt.Equal(run.HeartbeatAt) {
		t.Errorf("after a heartbeat: %+v, want heartbeat (and so far) at +30m", run)
	}
	other, err := db.StartJobRun(ctx, JobRun{Job: "hourly", Kind: "reconcile"})
	if err != nil {
		t.Fatal(err)
	}

	// At +1h20m the nightly run beat 50m ago: it may be alive elsewhere.
	clk.Set(t0.Add(80 * time.Minute))
	if n, err := db.AbandonStaleJobRuns(ctx); err != nil || n != 0 {
		t.Fatalf("AbandonStaleJobRuns = %d, %v; want none", n, err)
	}
	next, err := db.StartJobRun(ctx, JobRun{Job: "nightly", Kind: "sync"})
	if err != nil {
		t.Fatal(err)
	}
	runs, err := db.JobRuns(ctx, "nightly", 0)
	if err != nil || len(runs) != 3 || runs[2].ID != killed || runs[2].Status != "running" {
		t.Fatalf("runs %+v (%v): want the killed run still running", runs, err)
	}
	if err := db.FinishJobRun(ctx, JobRun{ID: next, Job: "nightly", Status: "ok",
		Counts: backstop.JobCounts{Pages: 2, Objects: 30}}); err != nil {
		t.Fatal(err)
	}
	if run := last("nightly"); run.ID != next || run.Status != "ok" || run.Counts.Objects != 30 ||
		!run.FinishedAt.Equal(t0.Add(80*time.Minute)) {
		t.Errorf("finished run: %+v", run)
	}
	if err := db.FinishJobRun(ctx, JobRun{ID: next, Job: "nightly", Status: "failed"}); !errors.Is(err, backstop.ErrNotFound) {
		t.Errorf("a run finished twice: %v, want ErrNotFound", err)
	}

	// At +1h31m the nightly run's heartbeat is over an hour old: the next
	// run of its job closes it; the hourly one (beat at +30m) too, by
	// maintenance.
	clk.Set(t0.Add(91 * time.Minute))
	again, err := db.StartJobRun(ctx, JobRun{Job: "nightly", Kind: "sync"})
	if err != nil {
		t.Fatal(err)
	}
	runs, _ = db.JobRuns(ctx, "nightly", 0)
	byID := map[int64]JobRun{}
	for _, r := range runs {
		byID[r.ID] = r
	}
	if k := byID[killed]; k.Status != "abandoned" || !strings.Contains(k.Error, "no heartbeat since") ||
		!k.FinishedAt.Equal(t0.Add(91*time.Minute)) {
		t.Errorf("killed run after the next start: %+v, want abandoned", k)
	}
	if a := byID[again]; a.Status != "running" {
		t.Errorf("the new run is %s", a.Status)
	}
	if err := db.JobRunHeartbeat(ctx, killed); err == nil || !strings.Contains(err.Error(), "abandoned") {
		t.Errorf("heartbeat of an abandoned run: %v", err)
	}
	if run := last("hourly"); run.ID != other || run.Status != "running" {
		t.Fatalf("hourly run before maintenance: %+v", run)
	}
	if n, err := db.AbandonStaleJobRuns(ctx); err != nil || n != 1 {
		t.Fatalf("AbandonStaleJobRuns = %d, %v; want the hourly run", n, err)
	}
	if run := last("hourly"); run.Status != "abandoned" {
		t.Errorf("hourly run after maintenance: %s", run.Status)
	}
	// A run closed as abandoned that did go on takes its real result.
	if err := db.FinishJobRun(ctx, JobRun{ID: other, Job: "hourly", Status: "interrupted"}); err != nil {
		t.Errorf("finishing a run closed as abandoned: %v", err)
	}
	if run := last("hourly"); run.Status != "interrupted" {
		t.Errorf("hourly run finished late: %s", run.Status)
	}
	if err := db.FinishJobRun(ctx, JobRun{ID: again, Job: "nightly", Status: "running"}); err == nil {
		t.Error("a run finished as running")
	}
}

// EmitPage commits a page's events and its cursor together: on failure
// neither is committed; on success both are, and a second emission of the
// same versions is a duplicate.
func TestEmitPageCommitsEventsWithCursor(t *testing.T) {
	db, _ := openTest(t)
	ctx := context.Background()
	routes := []backstop.Route{{Target: "crm", Events: []string{"contact.*"}}}
	mk := func(id, at string) backstop.Event {
		o := obj(t, backstop.Contacts, id, at, nil)
		return backstop.Event{
			ID: backstop.EventID(backstop.DedupKey(backstop.Contacts, id, o.UpdatedAt)), Type: "contact.created",
			Resource: backstop.Contacts, ObjectID: id, UpdatedAt: o.UpdatedAt, Origin: backstop.OriginSync, Data: o.Data,
		}
	}
	e1, e2 := mk("ct_1", "2024-04-01T00:00:00Z"), mk("ct_2", "2024-04-02T00:00:00Z")
	cur := backstop.Cursor{Resource: backstop.Contacts, Kind: backstop.CursorSync, Value: "c2",
		Position: backstop.Position{UpdatedAt: e2.UpdatedAt, ID: "ct_2"}}

	bad := e2
	bad.Data = []byte("{not json")
	if _, err := db.EmitPage(ctx, []backstop.Event{e1, bad}, routes, cur); err == nil {
		t.Fatal("EmitPage with a broken event succeeded")
	}
	if _, ok, err := db.Cursor(ctx, backstop.Contacts, backstop.CursorSync); err != nil {
		t.Fatal(err)
	} else if ok {
		t.Error("cursor saved although the page failed")
	}
	if n, err := db.CountProcessed(ctx); err != nil {
		t.Fatal(err)
	} else if n != 0 {
		t.Errorf("%d events kept from a failed page", n)
	}

	res, err := db.EmitPage(ctx, []backstop.Event{e1, e2}, routes, cur)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Status != backstop.EmitAccepted || !r.MirrorWritten || r.Outbox != 1 {
			t.Errorf("event %d: %+v, want accepted, mirrored, queued once", i, r)
		}
	}
	c, ok, err := db.Cursor(ctx, backstop.Contacts, backstop.CursorSync)
	if err != nil || !ok || c.Value != "c2" {
		t.Fatalf("cursor %+v ok=%v err=%v, want c2", c, ok, err)
	}
	if n, _ := db.Count(ctx, backstop.Contacts); n != 2 {
		t.Errorf("mirror holds %d contacts, want 2", n)
	}
	res, err = db.EmitPage(ctx, []backstop.Event{e1}, routes, cur)
	if err != nil || res[0].Status != backstop.EmitDuplicate {
		t.Errorf("re-emitted version: %+v, %v; want a duplicate", res, err)
	}
	if rows, _ := db.OutboxRows(ctx, "crm"); len(rows) != 2 {
		t.Errorf("%d outbox rows, want 2", len(rows))
	}
	if _, err := db.EmitPage(ctx, nil, routes, backstop.Cursor{Resource: "widgets", Kind: backstop.CursorSync}); err == nil {
		t.Error("cursor of an unknown resource accepted")
	}
}

// A run that holds its job's lock (in Redis) knows no other run of the job
// is going on: starting it closes the job's runs left running by a killed
// process at once, not an hour after their last heartbeat, and leaves
// other jobs' runs alone.
func TestLockedJobRunClosesRunsLeftRunning(t *testing.T) {
	db, clk := openTest(t)
	ctx := context.Background()
	killed, err := db.StartJobRun(ctx, JobRun{Job: "nightly", Kind: "sync"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := db.StartJobRun(ctx, JobRun{Job: "hourly", Kind: "reconcile"})
	if err != nil {
		t.Fatal(err)
	}
	clk.Set(t0.Add(90 * time.Second)) // the killed run beat 90 s ago
	// Without the lock, a run beating 90 s ago is taken for one going on.
	var running *JobRunningError
	if _, err := db.StartJobRun(ctx, JobRun{Job: "nightly", Kind: "sync"}); !errors.As(err, &running) || running.ID != killed {
		t.Fatalf("a run without the lock beside one beating 90 s ago: %v, want refused naming run %d", err, killed)
	}
	status := func(id int64) JobRun {
		t.Helper()
		runs, err := db.JobRuns(ctx, "nightly", 0)
		if err != nil {
			t.Fatal(err)
		}
		hourly, err := db.JobRuns(ctx, "hourly", 0)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, hourly...)
		for _, r := range runs {
			if r.ID == id {
				return r
			}
		}
		t.Fatalf("run %d not found", id)
		return JobRun{}
	}
	if r := status(killed); r.Status != "running" {
		t.Fatalf("a run beating 90 s ago, closed by a run without the lock: %+v", r)
	}
	locked, err := db.StartJobRun(ctx, JobRun{Job: "nightly", Kind: "sync", Locked: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []int64{killed} {
		if r := status(id); r.Status != "abandoned" || !strings.Contains(r.Error, "lock was free") {
			t.Errorf("run %d after a locked start: %+v, want abandoned, saying why", id, r)
		}
	}
	if r := status(locked); r.Status != "running" {
		t.Errorf("the locked run is %s", r.Status)
	}
	if r := status(other); r.Status != "running" {
		t.Errorf("another job's run is %s, want still running", r.Status)
	}
	// A run closed so whose process was in fact stopping still records
	// its real result.
	if err := db.FinishJobRun(ctx, JobRun{ID: killed, Job: "nightly", Status: "interrupted"}); err != nil {
		t.Fatal(err)
	}
	if r := status(killed); r.Status != "interrupted" {
		t.Errorf("finished after being closed: %+v", r)
	}
}

// Without a lock in Redis, a run of a job is refused while another run of
// it, in another process sharing the store, has beaten within
// JobRunLiveWithin (two cron runs overlapping, or serve's schedule and a
// run by hand): the refusal names the run going on. A run whose process
// was killed holds the job up that long at most; other jobs are not held.
func TestJobRunRefusedWhileAnotherGoesOn(t *testing.T) {
	db, clk := openTest(t)
	ctx := context.Background()
	first, err := db.StartJobRun(ctx, JobRun{Job: "nightly", Kind: "sync"})
	if err != nil {
		t.Fatal(err)
	}
	refused := func(at time.Duration) {
		t.Helper()
		clk.Set(t0.Add(at))
		_, err := db.StartJobRun(ctx, JobRun{Job: "nightly", Kind: "sync"})
		var running *JobRunningError
		if !errors.As(err, &running) || !errors.Is(err, backstop.ErrJobRunning) || running.ID != first ||
			!strings.Contains(err.Error(), fmt.Sprintf("run %d", first)) {
			t.Fatalf("a second run at +%s: %v, want refused naming run %d", at, err, first)
		}
	}
	refused(30 * time.Second)
	if _, err := db.StartJobRun(ctx, JobRun{Job: "hourly", Kind: "reconcile"}); err != nil {
		t.Fatalf("another job held up: %v", err)
	}
	// It beats at +2m, so it is still going on at +4m.
	clk.Set(t0.Add(2 * time.Minute))
	if err := db.JobRunHeartbeat(ctx, first); err != nil {
		t.Fatal(err)
	}
	refused(4 * time.Minute)
	// No heartbeat for more than JobRunLiveWithin: its process is gone.
	clk.Set(t0.Add(2*time.Minute + JobRunLiveWithin + time.Second))
	next, err := db.StartJobRun(ctx, JobRun{Job: "nightly", Kind: "sync"})
	if err != nil || next == first {
		t.Fatalf("a run after the first stopped beating: %d, %v", next, err)
	}
}

// A run left running by a process that is gone from this host (a serve
// killed with SIGKILL and restarted at once) does not hold its job up for
// JobRunLiveWithin after its last heartbeat: the next run of the job
// closes it as abandoned, saying which process it was, and starts. A run
// whose process lives, or that this process cannot tell about (another
// host, another pid namespace or boot, an older binary that stored no
// owner), still does.
func TestJobRunOfAGoneProcessDoesNotHoldItsJob(t *testing.T) {
	me, dead := goneProcess(t)
	owner := func(host string, pid int, start, space string) string {
		return runOwner{host: host, pid: pid, start: start, space: space}.String()
	}
	for _, c := range []struct {
		name  string
		owner any // the owner stored for the first run: nil stores none
		gone  bool
	}{
		{"exited child", owner(me.host, dead, "12345", me.space), true},
		{"this pid started at another time", owner(me.host, me.pid, me.start+"0", me.space), true},
		{"this process", me.String(), false},
		{"another host", owner(me.host+"-other", dead, "12345", me.space), false},
		{"another pid namespace", owner(me.host, dead, "12345", me.space+"0"), false},
		{"an older binary", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			db, clk := openTest(t)
			ctx := context.Background()
			first, err := db.StartJobRun(ctx, JobRun{Job: "nightly", Kind: "sync"})
			if err != nil {
				t.Fatal(err)
			}
			if runs, err := db.JobRuns(ctx, "nightly", 0); err != nil || len(runs) != 1 || runs[0].Owner != me.String() {
				t.Fatalf("a started run: %+v (%v), want owned by %s", runs, err, me)
			}
			if _, err := db.w.ExecContext(ctx, `UPDATE job_runs SET owner = ? WHERE id = ?`, c.owner, first); err != nil {
				t.Fatal(err)
			}
			clk.Set(t0.Add(30 * time.Second)) // its heartbeat is fresh
			next, err := db.StartJobRun(ctx, JobRun{Job: "nightly", Kind: "sync"})
			runs, lerr := db.JobRuns(ctx, "nightly", 0)
			if lerr != nil {
				t.Fatal(lerr)
			}
			byID := map[int64]JobRun{}
			for _, r := range runs {
				byID[r.ID] = r
			}
			if !c.gone {
				var running *JobRunningError
				if !errors.As(err, &running) || running.ID != first {
					t.Fatalf("beside a run beating 30 s ago: %v, want refused naming run %d", err, first)
				}
				if r := byID[first]; r.Status != "running" {
					t.Errorf("the first run is %s, want still running", r.Status)
				}
				return
			}
			if err != nil {
				t.Fatalf("beside a run of a process gone: %v, want started", err)
			}
			o, _ := parseOwner(fmt.Sprint(c.owner))
			want := fmt.Sprintf("abandoned: its process (pid %d on host %s) is gone", o.pid, o.host)
			if r := byID[first]; r.Status != "abandoned" || !strings.Contains(r.Error, want) ||
				!r.FinishedAt.Equal(t0.Add(30*time.Second)) {
				t.Errorf("the run of a process gone: %+v, want abandoned at once, saying %q", r, want)
			}
			if r := byID[next]; r.Status != "running" || r.Owner != me.String() {
				t.Errorf("the new run: %+v, want running, owned by this process", r)
			}
		})
	}
}

// goneProcess returns this process as an owner and a pid that was a
// process of this host a moment ago and is free now.
func goneProcess(t *testing.T) (me runOwner, dead int) {
	t.Helper()
	me = processOwner()
	if me.start == "" || me.space == "" {
		t.Skip("no /proc: a process's owner is not known")
	}
	child := exec.Command("true")
	if err := child.Run(); err != nil {
		t.Fatal(err)
	}
	return me, child.Process.Pid
}

// An owner is stored and read back as it is, and what is not one is not
// taken for one.
func TestRunOwnerRoundTrip(t *testing.T) {
	o := runOwner{host: "web-1", pid: 4242, start: "987654", space: "3687ee31-b3b1-4999-9f28-7f7178b945f2:4026531836"}
	if got, ok := parseOwner(o.String()); !ok || got != o {
		t.Errorf("parseOwner(%q) = %+v, %v", o.String(), got, ok)
	}
	for _, s := range []string{"", "web-1", "web-1/x/1/2", "web-1/0/1/2", "web-1/12/1"} {
		if _, ok := parseOwner(s); ok {
			t.Errorf("parseOwner(%q) is an owner", s)
		}
	}
	if me := processOwner(); me.start != "" {
		if start, err := procStart(me.pid); err != nil || start != me.start {
			t.Errorf("procStart(self) = %q, %v; want %q", start, err, me.start)
		}
	}
}
