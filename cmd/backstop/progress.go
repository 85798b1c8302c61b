package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	stdsync "sync"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/cmd/backstop/config"
)

// defaultProgressInterval is how often a run that draws no bars logs a
// progress line per resource; BACKSTOP_PROGRESS_INTERVAL (a duration)
// changes it.
const defaultProgressInterval = 5 * time.Second

// progress shows how a long run (sync, backfill, reconcile, or a job of
// one of those kinds under backstop run) is going: a bar per resource on a
// terminal, a log line per resource every few seconds otherwise, and a
// line per resource when it ends.
type progress struct {
	op       string
	bars     *mpb.Progress // nil when not on a terminal
	out      io.Writer     // where logs go
	log      *slog.Logger  // set by start
	interval time.Duration
	started  time.Time
	// stop ends the ticker start runs without bars; ticked is closed once
	// it has ended. Both nil when none runs.
	stop, ticked chan struct{}

	// order, when set, is the order a job runs its resources in, one
	// after another (sequential): one not begun yet says it is queued
	// behind the one going on rather than waiting for its first page.
	order []backstop.Resource

	mu    stdsync.Mutex
	state map[backstop.Resource]*resourceProgress
	// lockUntil is when the run may begin, while it waits for its job's
	// lock (lockWait); zero otherwise.
	lockUntil time.Time
}

type resourceProgress struct {
	counts   counts
	lastLog  time.Time
	lastPage time.Time // zero before the first page
	bar      *mpb.Bar
	ended    bool // done was called
}

// counts is one resource's totals so far, as the bar shows them (line) and
// as log attributes (attrs), made from a RunStats or a ReconcileReport.
type counts struct {
	line  string
	attrs []any
}

func newProgress(m *Main, op string, resources []backstop.Resource) *progress {
	interval, err := progressInterval(m)
	if err != nil {
		// Refused before the command ran (showsProgress).
		interval = defaultProgressInterval
	}
	p := &progress{op: op, out: m.Stderr, interval: interval, started: time.Now(), state: map[backstop.Resource]*resourceProgress{}}
	if m.IsTerminal {
		// Main.IsTerminal decides, not mpb's own look at the writer.
		p.bars = mpb.New(mpb.WithOutput(m.Stderr), mpb.WithAutoRefresh(), mpb.WithWidth(16),
			mpb.WithRefreshRate(150*time.Millisecond))
		p.out = p.bars
	}
	for _, r := range resources {
		rp := &resourceProgress{lastLog: time.Now()}
		p.state[r] = rp
		if p.bars != nil {
			r := r
			rp.bar = p.bars.New(0, mpb.SpinnerStyle(),
				mpb.PrependDecorators(decor.Name(fmt.Sprintf("%s %-9s", op, r))),
				mpb.AppendDecorators(decor.Any(func(decor.Statistics) string { return p.line(r) })),
				mpb.BarFillerOnComplete("✓"),
			)
		}
	}
	return p
}

// progressInterval is BACKSTOP_PROGRESS_INTERVAL, or
// defaultProgressInterval when it is unset or empty. A value that is not a
// positive duration is a usage error (exit 2) naming the variable; the
// commands that show progress check it before they run (showsProgress).
func progressInterval(m *Main) (time.Duration, error) {
	if m.LookupEnv == nil {
		return defaultProgressInterval, nil
	}
	v, ok := m.LookupEnv("BACKSTOP_PROGRESS_INTERVAL")
	if !ok || v == "" {
		return defaultProgressInterval, nil
	}
	if d, err := config.ParseDuration(v); err == nil && d > 0 {
		return time.Duration(d), nil
	}
	return 0, usagef("BACKSTOP_PROGRESS_INTERVAL %q: want a positive duration such as 5s or 1m (how often a run without progress bars logs each resource's progress)", v)
}

// feedCounts are the counters of a sync or backfill, with its rate and how
// far through the feed it has read (the platform gives no totals, so
// there is no percentage: the feed is in updated_at order, and the time
// reached against now says how much is left).
func feedCounts(st backstop.RunStats, elapsed string) counts {
	rate := 0.0
	if st.Duration > 0 {
		rate = float64(st.Objects) / st.Duration.Seconds()
	}
	line := fmt.Sprintf("%d pages  %d objects  %.0f/s  %d new  %d updated  %d requests  %d×429  throttled %s",
		st.Pages, st.Objects, rate, st.New, st.Updated, st.Requests, st.RateLimited, round(st.ThrottleWait))
	attrs := []any{"resource", st.Resource, "pages", st.Pages, "objects", st.Objects, "objects_per_s", math.Round(rate),
		"new", st.New, "updated", st.Updated, "requests", st.Requests, "rate_limited", st.RateLimited,
		"throttle_wait", round(st.ThrottleWait), elapsed, round(st.Duration)}
	if !st.Reached.IsZero() {
		// First: it says how much is left, and a narrow terminal cuts
		// the line's end.
		line = "reached " + st.Reached.UTC().Format("2006-01-02 15:04") + "  " + line
		attrs = append(attrs, "reached", st.Reached.UTC().Format(time.RFC3339))
	}
	return counts{line: line, attrs: attrs}
}

// reconcileCounts are the counters of a reconcile.
func reconcileCounts(rep backstop.ReconcileReport, elapsed string) counts {
	return counts{
		line: fmt.Sprintf("%d pages  %d scanned  %d missing  %d behind  %d re-emitted  %d requests  %d×429  throttled %s",
			rep.Pages, rep.Scanned, rep.Missing, rep.Behind, rep.Reemitted, rep.Requests, rep.RateLimited,
			round(rep.ThrottleWait)),
		attrs: []any{"resource", rep.Resource, "pages", rep.Pages, "scanned", rep.Scanned, "missing", rep.Missing,
			"behind", rep.Behind, "reemitted", rep.Reemitted, "suppressed", rep.Suppressed,
			"requests", rep.Requests, "rate_limited", rep.RateLimited,
			"throttle_wait", round(rep.ThrottleWait), elapsed, round(rep.Duration)},
	}
}

// start sets the logger the progress lines and the end of each resource
// are logged to, once it exists. Without bars it also logs, every
// interval, each resource still running that has logged no line for that
// long: its totals as of its last page and how long ago that page was (or
// that its first is still awaited), so that a run waiting on the rate
// limit or a slow platform still says it is alive. wait or abort stops
// that.
func (p *progress) start(log *slog.Logger) {
	p.log = log
	if p.bars != nil || log == nil || p.stop != nil {
		return
	}
	p.stop, p.ticked = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(p.ticked)
		// A line is due interval after the last; a quarter of it late at
		// most.
		t := time.NewTicker(max(p.interval/4, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
			}
			p.logIdle(log, time.Now())
		}
	}()
}

// logIdle logs a line for each resource, still running, that logged none
// for an interval until now. It logs under p.mu, so that no such line
// comes after the line done logs when the resource ends.
func (p *progress) logIdle(log *slog.Logger, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for r, rp := range p.state {
		if rp.ended || now.Sub(rp.lastLog) < p.interval {
			continue
		}
		rp.lastLog = now
		if rp.lastPage.IsZero() {
			waiting := "for its first page"
			if lock := p.lockWaitLocked(now); lock != "" {
				waiting = lock
			} else if ahead := p.runningAhead(r); ahead != "" {
				waiting = "queued after " + string(ahead) + " (the job runs its resources one after another)"
			}
			log.Info(p.op+" progress", "resource", r, "pages", 0, "waiting", waiting, "elapsed", round(now.Sub(p.started)))
			continue
		}
		log.Info(p.op+" progress", append(slices.Clone(rp.counts.attrs), "since_last_page", round(now.Sub(rp.lastPage)))...)
	}
}

// sequential makes p show a job's resources as run in order, one after
// another.
func (p *progress) sequential(order []backstop.Resource) *progress {
	p.order = order
	return p
}

// runningAhead returns, when p's resources run one after another, the
// first resource before r in their order that has not ended (the one
// going on); empty otherwise. p.mu is held.
func (p *progress) runningAhead(r backstop.Resource) backstop.Resource {
	for _, o := range p.order {
		if o == r {
			return ""
		}
		if rp := p.state[o]; rp != nil && !rp.ended {
			return o
		}
	}
	return ""
}

// stopTicker ends start's ticker, if any, and waits for it.
func (p *progress) stopTicker() {
	if p.stop != nil {
		close(p.stop)
		<-p.ticked
		p.stop = nil
	}
}

// line renders one resource's counters.
func (p *progress) line(r backstop.Resource) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rp := p.state[r]; rp.lastPage.IsZero() {
		if lock := p.lockWaitLocked(time.Now()); lock != "" {
			return "waiting " + lock
		}
	}
	return p.state[r].counts.line
}

// lockWait records that the run waits wait from now before it begins: its
// job's lock in Redis was new there (see bsync.WithLockWait). p may be nil.
func (p *progress) lockWait(wait time.Duration) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.lockUntil = time.Now().Add(wait)
	p.mu.Unlock()
}

// lockWaitLocked says what the run waits for at now while it waits for its
// job's lock, or "" when it does not; p.mu is held.
func (p *progress) lockWaitLocked(now time.Time) string {
	if !now.Before(p.lockUntil) {
		return ""
	}
	return fmt.Sprintf("for the job's lock, new to Redis (its first use there, or Redis lost its data): the run starts in %s, "+
		"once a run that may still hold it elsewhere has stopped", round(p.lockUntil.Sub(now)))
}

// page records a committed page of a sync or backfill (Engine.OnPage).
func (p *progress) page(st backstop.RunStats) {
	p.update(st.Resource, feedCounts(st, "elapsed"))
}

// reconcilePage records a reconciled page (ReconcileOptions.OnPage).
func (p *progress) reconcilePage(rep backstop.ReconcileReport) {
	p.update(rep.Resource, reconcileCounts(rep, "elapsed"))
}

// update records r's totals and logs them when a line is due.
func (p *progress) update(r backstop.Resource, c counts) {
	p.mu.Lock()
	rp := p.state[r]
	if rp == nil {
		p.mu.Unlock()
		return
	}
	rp.counts = c
	rp.lastPage = time.Now()
	due := p.bars == nil && time.Since(rp.lastLog) >= p.interval
	if due {
		rp.lastLog = rp.lastPage
	}
	p.mu.Unlock()
	if due && p.log != nil {
		p.log.Info(p.op+" progress", c.attrs...)
	}
}

// finish records a sync's or backfill's final stats.
func (p *progress) finish(st backstop.RunStats) {
	p.done(st.Resource, feedCounts(st, "duration"), st.Err)
}

// reconcileFinish records a reconcile's final report.
func (p *progress) reconcileFinish(rep backstop.ReconcileReport) {
	p.done(rep.Resource, reconcileCounts(rep, "duration"), rep.Err)
}

// done closes r's bar and logs how its run ended.
func (p *progress) done(r backstop.Resource, c counts, err error) {
	p.mu.Lock()
	rp := p.state[r]
	if rp != nil {
		rp.counts = c
		rp.ended = true
	}
	p.mu.Unlock()
	if rp != nil && rp.bar != nil {
		if err != nil {
			rp.bar.Abort(false)
		} else {
			rp.bar.SetTotal(-1, true)
		}
	}
	if p.log != nil {
		switch {
		case err == nil && p.bars != nil:
			// The bar already shows it.
		case err == nil:
			p.log.Info(p.op+" finished", c.attrs...)
		case isCanceled(err):
			p.log.Warn(p.op+" interrupted", c.attrs...)
		default:
			p.log.Error(p.op+" failed", append(c.attrs, "error", err.Error())...)
		}
	}
}

// wait lets the bars draw their last frame. The bars of resources that
// never ran (a job stopped before it reached them) are removed.
func (p *progress) wait() {
	p.stopTicker()
	if p.bars == nil {
		return
	}
	p.mu.Lock()
	for _, rp := range p.state {
		if !rp.ended {
			rp.bar.Abort(true)
		}
	}
	p.mu.Unlock()
	p.bars.Wait()
}

func isCanceled(err error) bool { return errors.Is(err, context.Canceled) }

// abortIfAny is abort on a progress that may be nil.
func (p *progress) abortIfAny() {
	if p != nil {
		p.abort()
	}
}

// abort removes the bars when the run never started.
func (p *progress) abort() {
	p.stopTicker()
	if p.bars == nil {
		return
	}
	for _, rp := range p.state {
		rp.bar.Abort(true)
	}
	p.bars.Wait()
}
