package sync_test

import (
	"context"
	"database/sql"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/internal/syncbuf"
	"github.com/backstop-sync/backstop/store"
	bsync "github.com/backstop-sync/backstop/sync"
)

// retryWorld is a store where the job "hourly" (a sync, every hour) is
// overdue, so that a scheduler runs it as it starts, and the means to
// play another process's run of it.
type retryWorld struct {
	t     *testing.T
	db    *store.DB
	raw   *sql.DB // the same file, to move a run's heartbeat
	lists atomic.Int32
	logs  syncbuf.Buffer
}

func newRetryWorld(t *testing.T) *retryWorld {
	t.Helper()
	path := filepath.Join(t.TempDir(), "j.db")
	db, err := store.Open(context.Background(), path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	raw, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	ago := time.Now().Add(-2 * time.Hour)
	if _, err := db.SaveJobRun(t.Context(), store.JobRun{Job: "hourly", Kind: "sync", Status: "ok",
		StartedAt: ago, FinishedAt: ago.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	return &retryWorld{t: t, db: db, raw: raw}
}

// scheduler returns a started scheduler of the job, with opts's Locker.
func (w *retryWorld) scheduler(opts bsync.SchedulerOptions) *bsync.Scheduler {
	w.t.Helper()
	src := funcSource{ListFunc: func(ctx context.Context, req backstop.ListRequest) (backstop.Page, error) {
		w.lists.Add(1)
		return backstop.Page{Cost: backstop.Cost{Requests: 1}}, nil
	}}
	opts.Engine = &bsync.Engine{Source: src, Mirror: w.db}
	opts.Store = jobStore{w.db}
	opts.Logger = slog.New(slog.NewTextHandler(&w.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := bsync.NewScheduler([]bsync.Job{{
		Name: "hourly", Kind: bsync.JobSync, Resources: []backstop.Resource{backstop.Contacts}, Every: time.Hour,
	}}, opts)
	if err != nil {
		w.t.Fatal(err)
	}
	s.Start()
	w.t.Cleanup(func() { s.Stop() })
	return s
}

// otherRun stores a run of the job going on in another process (it is
// this one's, which lives: the store cannot take it for gone) whose last
// heartbeat leaves it holding the job for heldFor more.
func (w *retryWorld) otherRun(heldFor time.Duration) int64 {
	w.t.Helper()
	id, err := w.db.StartJobRun(w.t.Context(), store.JobRun{Job: "hourly", Kind: "sync"})
	if err != nil {
		w.t.Fatal(err)
	}
	w.beat(id, heldFor)
	return id
}

// beat moves run id's last heartbeat so that it holds the job for
// heldFor more.
func (w *retryWorld) beat(id int64, heldFor time.Duration) {
	w.t.Helper()
	at := time.Now().Add(heldFor - store.JobRunLiveWithin)
	if _, err := w.raw.Exec(`UPDATE job_runs SET heartbeat_at = ? WHERE id = ?`, backstop.CanonicalTime(at), id); err != nil {
		w.t.Fatal(err)
	}
}

// runs returns the job's stored runs by status.
func (w *retryWorld) runs() map[string][]store.JobRun {
	w.t.Helper()
	rs, err := w.db.JobRuns(w.t.Context(), "hourly", 0)
	if err != nil {
		w.t.Fatal(err)
	}
	out := map[string][]store.JobRun{}
	for _, r := range rs {
		out[r.Status] = append(out[r.Status], r)
	}
	return out
}

// A scheduled run skipped because the job's run in another process still
// beat lately is tried again once that run would stop holding the job
// were its process gone: refused again while that run beats on (not
// stored as one more skipped run), it runs once the run stops beating,
// minutes later rather than an interval (an hour here) later. It used to
// wait for the next tick.
func TestJobSkippedForAnotherProcessIsTriedAgain(t *testing.T) {
	w := newRetryWorld(t)
	other := w.otherRun(300 * time.Millisecond)
	w.scheduler(bsync.SchedulerOptions{})
	waitFor(t, "the scheduled run skipped", func() bool { return len(w.runs()["skipped"]) == 1 })
	// The other run beats once more: the first try again, a second
	// after its former heartbeat went stale, is refused too.
	w.beat(other, 2*time.Second)
	waitFor(t, "a run to its end", func() bool {
		for _, r := range w.runs()["ok"] {
			if r.ID > other {
				return true
			}
		}
		return false
	})
	rs := w.runs()
	if n := len(rs["skipped"]); n != 1 {
		t.Errorf("%d skipped runs stored, want the scheduled one only (a refused try again is not stored)", n)
	}
	if w.lists.Load() == 0 {
		t.Error("the run read no page")
	}
	if n := strings.Count(w.logs.String(), "tried again later"); n != 1 {
		t.Errorf("%d tries again refused, want 1:\n%s", n, w.logs.String())
	}
}

// A skipped run is not tried again when the run that held the job up ran
// to its end meanwhile: the job did run.
func TestJobSkippedRunNotTriedAgainOnceTheOtherRunEnded(t *testing.T) {
	w := newRetryWorld(t)
	other := w.otherRun(200 * time.Millisecond)
	w.scheduler(bsync.SchedulerOptions{})
	waitFor(t, "the scheduled run skipped", func() bool { return len(w.runs()["skipped"]) == 1 })
	if err := w.db.FinishJobRun(t.Context(), store.JobRun{ID: other, Job: "hourly", Status: "ok"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the try again given up", func() bool {
		return strings.Contains(w.logs.String(), "not tried again: the job ran to its end meanwhile")
	})
	rs := w.runs()
	if len(rs["ok"]) != 2 || len(rs["skipped"]) != 1 || len(rs) != 2 || w.lists.Load() != 0 {
		t.Errorf("runs %v after %d pages read, want the two ok runs and the skipped one, no page", rs, w.lists.Load())
	}
}

// The same when the other process's clock is behind this one's: its run,
// stored with a start before that of the last run that had ended, ended
// all the same (the store's run ids tell, not the starts).
func TestJobSkippedRunNotTriedAgainOnceARunOfAClockBehindEnded(t *testing.T) {
	w := newRetryWorld(t)
	other := w.otherRun(200 * time.Millisecond)
	w.scheduler(bsync.SchedulerOptions{})
	waitFor(t, "the scheduled run skipped", func() bool { return len(w.runs()["skipped"]) == 1 })
	behind := time.Now().Add(-3 * time.Hour) // before newRetryWorld's run, 2 hours ago
	if _, err := w.raw.Exec(`UPDATE job_runs SET started_at = ? WHERE id = ?`, backstop.CanonicalTime(behind), other); err != nil {
		t.Fatal(err)
	}
	if err := w.db.FinishJobRun(t.Context(), store.JobRun{ID: other, Job: "hourly", Status: "ok"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the try again given up", func() bool {
		return strings.Contains(w.logs.String(), "not tried again: the job ran to its end meanwhile")
	})
	if rs := w.runs(); len(rs["ok"]) != 2 || w.lists.Load() != 0 {
		t.Errorf("runs %v after %d pages read, want the two ok runs, no page", rs, w.lists.Load())
	}
}

// With job locks in Redis, a scheduled run refused because another
// process holds the job's lock is tried again once the lock would expire
// unless renewed: a lock left by a process that died (here a key no
// process renews) no longer costs the job its interval.
func TestJobSkippedForAJobLockIsTriedAgain(t *testing.T) {
	rdb := redisClient(t)
	w := newRetryWorld(t)
	const ttl = 300 * time.Millisecond
	if err := rdb.Set(t.Context(), bsync.DefaultJobLockPrefix+"hourly", "a-process-that-died", ttl).Err(); err != nil {
		t.Fatal(err)
	}
	w.scheduler(bsync.SchedulerOptions{Locker: newJobLocks(t, rdb, ttl)})
	waitFor(t, "the scheduled run skipped", func() bool { return len(w.runs()["skipped"]) == 1 })
	waitFor(t, "a run to its end", func() bool { return len(w.runs()["ok"]) == 2 })
	if w.lists.Load() == 0 {
		t.Error("the run read no page")
	}
}
