package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	stdsync "sync"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"

	"github.com/backstop-sync/backstop"
)

// progress shows how a long run is going: a bar per resource on a terminal,
// a log line per resource every few seconds otherwise.
type progress struct {
	op       string
	bars     *mpb.Progress // nil when not on a terminal
	out      io.Writer     // where logs go
	log      *slog.Logger  // set once the logger exists
	interval time.Duration

	mu    stdsync.Mutex
	state map[backstop.Resource]*resourceProgress
}

type resourceProgress struct {
	stats   backstop.RunStats
	lastLog time.Time
	bar     *mpb.Bar
}

func newProgress(m *Main, op string, resources []backstop.Resource) *progress {
	p := &progress{op: op, out: m.Stderr, interval: 5 * time.Second, state: map[backstop.Resource]*resourceProgress{}}
	if m.IsTerminal {
		p.bars = mpb.New(mpb.WithOutput(m.Stderr), mpb.WithWidth(16), mpb.WithRefreshRate(150*time.Millisecond))
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

// line renders one resource's counters.
func (p *progress) line(r backstop.Resource) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.state[r].stats
	return fmt.Sprintf("%d pages  %d objects  %d new  %d updated  %d requests  %d×429  throttled %s",
		s.Pages, s.Objects, s.New, s.Updated, s.Requests, s.RateLimited, round(s.ThrottleWait))
}

// page records a committed page (Engine.OnPage).
func (p *progress) page(st backstop.RunStats) {
	p.mu.Lock()
	rp := p.state[st.Resource]
	if rp == nil {
		p.mu.Unlock()
		return
	}
	rp.stats = st
	due := p.bars == nil && time.Since(rp.lastLog) >= p.interval
	if due {
		rp.lastLog = time.Now()
	}
	p.mu.Unlock()
	if due && p.log != nil {
		p.log.Info(p.op+" progress", "resource", st.Resource, "pages", st.Pages, "objects", st.Objects,
			"new", st.New, "updated", st.Updated, "requests", st.Requests, "rate_limited", st.RateLimited,
			"throttle_wait", round(st.ThrottleWait), "elapsed", round(st.Duration))
	}
}

// finish records a resource's final stats.
func (p *progress) finish(st backstop.RunStats) {
	p.mu.Lock()
	rp := p.state[st.Resource]
	if rp != nil {
		rp.stats = st
	}
	p.mu.Unlock()
	if rp != nil && rp.bar != nil {
		if st.Err != nil {
			rp.bar.Abort(false)
		} else {
			rp.bar.SetTotal(-1, true)
		}
	}
	if p.log != nil {
		attrs := []any{"resource", st.Resource, "pages", st.Pages, "objects", st.Objects, "new", st.New,
			"updated", st.Updated, "requests", st.Requests, "rate_limited", st.RateLimited,
			"throttle_wait", round(st.ThrottleWait), "duration", round(st.Duration)}
		switch {
		case st.Err == nil && p.bars != nil:
			// The bar already shows it.
		case st.Err == nil:
			p.log.Info(p.op+" finished", attrs...)
		case isCanceled(st.Err):
			p.log.Warn(p.op+" interrupted", attrs...)
		default:
			p.log.Error(p.op+" failed", append(attrs, "error", st.Err.Error())...)
		}
	}
}

// wait lets the bars draw their last frame.
func (p *progress) wait() {
	if p.bars != nil {
		p.bars.Wait()
	}
}

func isCanceled(err error) bool { return errors.Is(err, context.Canceled) }

// abort removes the bars when the run never started.
func (p *progress) abort() {
	if p.bars == nil {
		return
	}
	for _, rp := range p.state {
		rp.bar.Abort(true)
	}
	p.bars.Wait()
}
