package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/backstop-sync/backstop"
)

// runsShown is how many runs of each job the jobs page lists.
const runsShown = 10

// reportsShown is how many reconcile reports the jobs page lists.
const reportsShown = 20

type jobsData struct {
	Leader  JobsLeader
	Jobs    []Job
	Reports []ReconcileRun
	Cursors []backstop.Cursor
}

// jobsPage lists the jobs with their schedule, next run and last runs, the
// reconcile reports and the cursors.
func (d *Dashboard) jobsPage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	data := jobsData{Leader: d.opts.Backend.JobsLeader()}
	var err error
	if data.Jobs, err = d.opts.Backend.Jobs(ctx, runsShown); err != nil {
		d.backendError(w, r, err)
		return
	}
	d.mu.Lock()
	for i := range data.Jobs {
		data.Jobs[i].Running = data.Jobs[i].Running || d.running[data.Jobs[i].Name]
	}
	d.mu.Unlock()
	if data.Reports, err = d.opts.Backend.ReconcileRuns(ctx, reportsShown); err != nil {
		d.backendError(w, r, err)
		return
	}
	if data.Cursors, err = d.opts.Backend.Cursors(ctx); err != nil {
		d.backendError(w, r, err)
		return
	}
	d.render(w, r, http.StatusOK, "jobs", page{Title: "Jobs", Nav: "jobs", Data: data})
}

// runJob starts a run of a job now, in the background (a run can take
// minutes); its result is stored like any run and shows on the jobs page.
// It answers once the run has started, or has been refused: a job already
// running (started here, by its schedule, or in another process) is not
// started twice, and the answer says so (409). A run that holds its lock
// but waits before it begins (a lock new to Redis) is answered at once,
// 202, saying how long it waits.
func (d *Dashboard) runJob(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	jobs, err := d.opts.Backend.Jobs(r.Context(), 0)
	if err != nil {
		d.backendError(w, r, err)
		return
	}
	if !slices.ContainsFunc(jobs, func(j Job) bool { return j.Name == name }) {
		d.fail(w, r, http.StatusNotFound, "not_found", fmt.Sprintf("There is no job %q in the configuration.", name))
		return
	}
	d.mu.Lock()
	if d.running[name] {
		d.mu.Unlock()
		d.answer(w, r, http.StatusConflict, runningMsg(name), Prefix+"/jobs")
		return
	}
	if d.runCtx.Err() != nil {
		d.mu.Unlock()
		d.fail(w, r, http.StatusServiceUnavailable, "shutting_down", "backstop is shutting down; the job was not started.")
		return
	}
	d.running[name] = true
	d.runs.Add(1)
	d.mu.Unlock()
	started := make(chan struct{})
	waiting := make(chan time.Duration, 1)
	result := make(chan error, 1)
	go func() {
		defer d.runs.Done()
		defer func() {
			d.mu.Lock()
			delete(d.running, name)
			d.mu.Unlock()
		}()
		var once, waits sync.Once
		err := d.opts.Backend.RunJob(d.runCtx, name, func() { once.Do(func() { close(started) }) },
			func(wait time.Duration) { waits.Do(func() { waiting <- wait }) })
		result <- err
		switch {
		case err == nil:
			d.log.Info("dashboard: job run finished", "job", name)
		case errors.Is(err, ErrJobRunning), errors.Is(err, context.Canceled):
		default:
			d.log.Warn("dashboard: job run failed", "job", name, "err", err)
		}
	}()
	ended := false
	select {
	case <-started:
		// A result already there says more (a run refused just as
		// another one started).
		select {
		case err = <-result:
			ended = true
		default:
		}
	case err = <-result:
		ended = true
	case wait := <-waiting:
		// The lock is taken, and the run starts once the wait is over:
		// no need to hold the answer that long.
		d.log.Info("dashboard: job run starts after its lock's wait", "job", name, "wait", wait)
		d.answer(w, r, http.StatusAccepted, fmt.Sprintf("Job %s starts in %s: its lock in Redis is new there (its first use, or Redis lost its data), "+
			"so backstop waits that long for a run that may still hold the job elsewhere to stop. Its run shows here as running once it starts.",
			name, wait.Round(time.Second)), Prefix+"/jobs")
		return
	case <-r.Context().Done():
		return
	}
	if ended {
		switch {
		case errors.Is(err, ErrJobRunning):
			d.answer(w, r, http.StatusConflict, runningMsg(name), Prefix+"/jobs")
			return
		case err != nil && !errors.Is(err, context.Canceled):
			msg := fmt.Sprintf("Job %s started and failed: %v", name, err)
			select {
			case <-started:
			default: // refused before its work began (its lock, its store)
				msg = fmt.Sprintf("Job %s could not start: %v", name, err)
			}
			d.answer(w, r, http.StatusOK, msg, Prefix+"/jobs")
			return
		case err == nil:
			d.answer(w, r, http.StatusOK, fmt.Sprintf("Job %s started and has finished; its run shows below.", name), Prefix+"/jobs")
			return
		}
	}
	d.log.Info("dashboard: job run started", "job", name)
	d.answer(w, r, http.StatusAccepted, fmt.Sprintf("Job %s started; its run shows here as running until it ends.", name), Prefix+"/jobs")
}

// runningMsg says that job is running already and was not started again.
func runningMsg(job string) string {
	return fmt.Sprintf("Job %s is already running (a scheduled run, one started here, or one in another process); it was not started again. Its run shows here as running until it ends.", job)
}

// span is a time range a chart covers, cut into periods.
type span struct {
	Name   string
	Range  time.Duration
	Period time.Duration
}

// spans are the ranges the quota and intake pages offer.
var spans = []span{
	{"6h", 6 * time.Hour, 15 * time.Minute},
	{"24h", 24 * time.Hour, time.Hour},
	{"7d", 7 * 24 * time.Hour, 6 * time.Hour},
}

// spanOf returns the span the request asks for (default 24h); for a range
// that is not one of spans it answers 400 and returns false.
func (d *Dashboard) spanOf(w http.ResponseWriter, r *http.Request) (span, bool) {
	name := r.URL.Query().Get("range")
	if name == "" {
		return spans[1], true
	}
	names := make([]string, len(spans))
	for i, s := range spans {
		if s.Name == name {
			return s, true
		}
		names[i] = s.Name
	}
	d.fail(w, r, http.StatusBadRequest, "bad_range", fmt.Sprintf("Range %q is not one of %s.", name, strings.Join(names, ", ")))
	return span{}, false
}

// periods returns the starts of the periods of s ending with the one that
// holds now, aligned on the Unix epoch as the store aligns them.
func (s span) periods(now time.Time) []time.Time {
	last := now.Truncate(s.Period)
	n := int(s.Range / s.Period)
	out := make([]time.Time, n)
	for i := range out {
		out[i] = last.Add(-time.Duration(n-1-i) * s.Period).UTC()
	}
	return out
}

// index returns the period of periods that holds t, or -1.
func (s span) index(periods []time.Time, t time.Time) int {
	if len(periods) == 0 || t.Before(periods[0]) {
		return -1
	}
	i := int(t.Sub(periods[0]) / s.Period)
	if i >= len(periods) {
		return -1
	}
	return i
}

type quotaData struct {
	Span  span
	Spans []span
	Keys  []keyView
}

type keyView struct {
	KeyQuota
	Requests, RateLimited int
	ThrottleWait          time.Duration
	RequestChart          chart
	WaitChart             chart
}

// quotaPage shows each API key's budget now, and its requests, 429s and
// throttle waits over time.
func (d *Dashboard) quotaPage(w http.ResponseWriter, r *http.Request) {
	sp, ok := d.spanOf(w, r)
	if !ok {
		return
	}
	now := d.now()
	periods := sp.periods(now)
	keys, err := d.opts.Backend.Quota(r.Context(), periods[0])
	if err != nil {
		d.backendError(w, r, err)
		return
	}
	data := quotaData{Span: sp, Spans: spans}
	for _, k := range keys {
		v := keyView{KeyQuota: k}
		ok := make([]float64, len(periods))
		limited := make([]float64, len(periods))
		wait := make([]float64, len(periods))
		for _, s := range k.Samples {
			v.Requests += s.Requests
			v.RateLimited += s.RateLimited
			v.ThrottleWait += s.ThrottleWait
			// A sample counts what happened before it: it belongs to the
			// period its last moment falls in.
			i := sp.index(periods, s.At.Add(-time.Nanosecond))
			if i < 0 {
				continue
			}
			ok[i] += float64(s.Requests - s.RateLimited)
			limited[i] += float64(s.RateLimited)
			wait[i] += s.ThrottleWait.Seconds()
		}
		v.RequestChart = barChart(periods, sp.Period, "requests", []series{
			{Name: "answered", Class: "s-ok", Values: ok},
			{Name: "429 Too Many Requests", Class: "s-bad", Values: limited},
		})
		v.WaitChart = barChart(periods, sp.Period, "seconds", []series{
			{Name: "throttle wait", Class: "s-wait", Values: wait},
		})
		data.Keys = append(data.Keys, v)
	}
	d.render(w, r, http.StatusOK, "quota", page{Title: "Quota", Nav: "quota", Data: data})
}

type intakeData struct {
	Span      span
	Spans     []span
	Stats     IntakeStats
	Origins   []originTotal
	Events    chart
	Refusals  chart
	Total     int
	Dups, Bad int
}

type originTotal struct {
	Origin backstop.Origin
	Class  string
	Events int
}

// origins are the event origins in the order the intake chart stacks them.
var origins = []backstop.Origin{backstop.OriginWebhook, backstop.OriginSync, backstop.OriginReconcile,
	backstop.OriginBackfill, backstop.OriginManual}

// intakePage shows the events processed per period by origin, and the
// duplicates suppressed and signature failures.
func (d *Dashboard) intakePage(w http.ResponseWriter, r *http.Request) {
	sp, ok := d.spanOf(w, r)
	if !ok {
		return
	}
	periods := sp.periods(d.now())
	st, err := d.opts.Backend.Intake(r.Context(), periods[0], sp.Period)
	if err != nil {
		d.backendError(w, r, err)
		return
	}
	data := intakeData{Span: sp, Spans: spans, Stats: st}
	byOrigin := map[backstop.Origin][]float64{}
	totals := map[backstop.Origin]int{}
	for _, c := range st.ByOrigin {
		if byOrigin[c.Origin] == nil {
			byOrigin[c.Origin] = make([]float64, len(periods))
		}
		if i := sp.index(periods, c.Start); i >= 0 {
			byOrigin[c.Origin][i] += float64(c.Events)
			totals[c.Origin] += c.Events
			data.Total += c.Events
		}
	}
	var ss []series
	for _, o := range origins {
		data.Origins = append(data.Origins, originTotal{Origin: o, Class: "s-" + string(o), Events: totals[o]})
		if v := byOrigin[o]; v != nil {
			ss = append(ss, series{Name: string(o), Class: "s-" + string(o), Values: v})
		}
	}
	data.Events = barChart(periods, sp.Period, "events", ss)
	dups := make([]float64, len(periods))
	bad := make([]float64, len(periods))
	for _, s := range st.Samples {
		if i := sp.index(periods, s.At.Add(-time.Nanosecond)); i >= 0 {
			dups[i] += float64(s.Duplicates)
			bad[i] += float64(s.SignatureFailures)
			data.Dups += s.Duplicates
			data.Bad += s.SignatureFailures
		}
	}
	data.Refusals = barChart(periods, sp.Period, "requests", []series{
		{Name: "duplicates suppressed", Class: "s-dup", Values: dups},
		{Name: "signature failures", Class: "s-bad", Values: bad},
	})
	d.render(w, r, http.StatusOK, "intake", page{Title: "Intake", Nav: "intake", Data: data})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}
