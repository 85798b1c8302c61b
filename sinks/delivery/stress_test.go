package delivery

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The stress test drives the real dispatcher against the real store
// (newStoreQueue) with several targets, concurrency over 1 and small
// claims, so that deliverAll refills many times, while each target answers
// at random: 200 at once, slowly or after a long hang (within its Timeout),
// 500/503, no answer at all (a timeout), 429 with Retry-After: 1, and a
// few rows 400 (dead letter at once) or 500 on every attempt (dead letter
// once the schedule runs out). Rows are also queued while it runs. It then
// checks what a user of the dispatcher sees: every row ends where the
// rules say, the target got each row at least once and never again after
// a 2xx, the attempts logged for a row are the requests its target saw
// (count, order, status), retries and 429 pauses are kept, and no target
// ever had more than its Concurrency requests in flight, nor a row two at
// once.
//
// BACKSTOP_STRESS_SEED picks the scenario (the default is fixed); the seed
// is logged. Each target's answer to a row's n-th request is a function of
// the seed, the row and n, so a seed replays the same answers; the
// interleaving of course differs from run to run.

const (
	stressSeedEnv = "BACKSTOP_STRESS_SEED"
	// stressTimeout is each target's Timeout: every hang but the timeouts
	// is well within it.
	stressTimeout = 2 * time.Second
	// stressForceOK: a row's request after this many of them is answered
	// 200, so a row fails at most that many times (fewer than the
	// schedule's steps: no row but the doomed ones is dead-lettered).
	stressForceOK = 6
	// stressPauseSlack is how long after a 429 is answered a request sent
	// before the dispatcher saw it may still reach the target.
	stressPauseSlack = 500 * time.Millisecond
	// stressMaxGap bounds the wait between a row's requests: its retries
	// wait at most a 429's second and their turn; a row left claimed
	// until its lease ends (14 s or more here) waits longer.
	stressMaxGap = 10 * time.Second
)

// stressSchedule has more steps than stressForceOK, in milliseconds.
var stressSchedule = ms(10, 20, 30, 40, 50, 60, 80)

func stressSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(20260102)
	if s := os.Getenv(stressSeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", stressSeedEnv, s, err)
		}
		seed = v
	}
	t.Logf("seed %d (rerun with %s=%d)", seed, stressSeedEnv, seed)
	return seed
}

// stressHit is one request a stress target saw, and how it answered.
type stressHit struct {
	event    string
	attempt  int // its X-Delivery-Attempt
	arrived  time.Time
	answered time.Time // when its status was decided (before it was written)
	status   int       // 0: no answer (it waited for the client to time out)
	kind     string
}

// stressTarget is one target of the stress test: its server, what it saw,
// and its requests in flight, as the server and as the dispatcher's
// transport see them.
type stressTarget struct {
	name   string
	seed   uint64
	conc   int
	srv    *httptest.Server
	budget struct{ tooMany, timeouts atomic.Int32 }

	mu   sync.Mutex
	hits []stressHit
	seen map[string]int // requests per event

	server, client inFlight // server: the requests not left to time out

	rowMu    sync.Mutex
	rowNow   map[string]int // client side, per event
	rowTwice []string       // events sent twice at once
}

func newStressTarget(t *testing.T, name string, seed uint64, conc, tooMany, timeouts int) *stressTarget {
	t.Helper()
	st := &stressTarget{name: name, seed: seed, conc: conc, seen: map[string]int{}, rowNow: map[string]int{}}
	st.budget.tooMany.Store(int32(tooMany))
	st.budget.timeouts.Store(int32(timeouts))
	st.srv = httptest.NewServer(http.HandlerFunc(st.serve))
	t.Cleanup(st.srv.Close)
	return st
}

// draw returns a number in [0, 1) fixed by the seed, the target, the
// event, the request's number for it, and salt.
func (st *stressTarget) draw(event string, n int, salt string) float64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%s/%d/%s", st.seed, st.name, event, n, salt)
	return rand.New(rand.NewPCG(h.Sum64(), st.seed)).Float64()
}

func (st *stressTarget) serve(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	event := r.Header.Get(HeaderEventID)
	attempt, _ := strconv.Atoi(r.Header.Get(HeaderDeliveryAttempt))
	// Read to its end, so that the server sees the client hang up (its
	// context ends) while the request waits.
	_, _ = io.Copy(io.Discard, r.Body)
	st.mu.Lock()
	st.seen[event]++
	n := st.seen[event]
	st.mu.Unlock()

	status, kind, hold := http.StatusOK, "ok", time.Duration(0)
	u := st.draw(event, n, "answer")
	switch {
	case strings.Contains(event, "_bad_"):
		status, kind = http.StatusBadRequest, "bad"
	case strings.Contains(event, "_doomed_"):
		status, kind = http.StatusInternalServerError, "doomed"
	case n > stressForceOK:
		// ok
	case u < 0.006 && st.budget.tooMany.Add(-1) >= 0:
		status, kind = http.StatusTooManyRequests, "429"
	case u < 0.010 && st.budget.timeouts.Add(-1) >= 0:
		status, kind = 0, "timeout"
	case u < 0.08:
		status, kind = http.StatusInternalServerError, "500"
	case u < 0.13:
		status, kind = http.StatusServiceUnavailable, "503"
	case u < 0.15:
		kind, hold = "hang", time.Duration(150+int(400*st.draw(event, n, "hold")))*time.Millisecond
	case u < 0.30:
		kind, hold = "slow", time.Duration(1+int(25*st.draw(event, n, "hold")))*time.Millisecond
	}
	if status != 0 {
		defer st.server.enter()()
	}
	if hold > 0 {
		timer := time.NewTimer(hold)
		select {
		case <-timer.C:
		case <-r.Context().Done():
			timer.Stop()
		}
	}
	if status == 0 {
		// The dispatcher's Timeout ends it (the bound is a safety net).
		timer := time.NewTimer(3 * stressTimeout)
		select {
		case <-r.Context().Done():
		case <-timer.C:
		}
		timer.Stop()
	}
	h := stressHit{event: event, attempt: attempt, arrived: arrived, answered: time.Now(), status: status, kind: kind}
	st.mu.Lock()
	st.hits = append(st.hits, h)
	st.mu.Unlock()
	if status == 0 {
		return
	}
	if status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(status)
}

// RoundTrip counts the dispatcher's requests in flight, until their
// answer's body is closed, in all and per event.
type stressTransport struct {
	st   *stressTarget
	base http.RoundTripper
}

func (tr stressTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	st, event := tr.st, req.Header.Get(HeaderEventID)
	out := st.client.enter()
	st.rowMu.Lock()
	st.rowNow[event]++
	if st.rowNow[event] > 1 {
		st.rowTwice = append(st.rowTwice, event)
	}
	st.rowMu.Unlock()
	var once sync.Once
	done := func() {
		once.Do(func() {
			st.rowMu.Lock()
			st.rowNow[event]--
			st.rowMu.Unlock()
			out()
		})
	}
	resp, err := tr.base.RoundTrip(req)
	if err != nil {
		done()
		return nil, err
	}
	resp.Body = &stressBody{ReadCloser: resp.Body, done: done}
	return resp, nil
}

type stressBody struct {
	io.ReadCloser
	done func()
}

func (b *stressBody) Close() error {
	err := b.ReadCloser.Close()
	b.done()
	return err
}

// stressRow is one queued row and what the target should make of it.
type stressRow struct {
	id     int64
	target *stressTarget
	event  string
	kind   string // "ok", "bad" or "doomed"
}

func TestStressDeliveries(t *testing.T) {
	seed := stressSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	q := newStoreQueue(t)

	nTargets := 2 + rng.IntN(2)
	var targets []*stressTarget
	var defs []Target
	perTarget := make([]int, nTargets)
	for i := range nTargets {
		conc := 2 + rng.IntN(7)
		st := newStressTarget(t, fmt.Sprintf("t%d", i), seed, conc, 1+rng.IntN(3), rng.IntN(3))
		targets = append(targets, st)
		defs = append(defs, Target{Name: st.name, URL: st.srv.URL, AllowPrivate: true, Concurrency: conc,
			Timeout: stressTimeout, RetrySchedule: stressSchedule})
		perTarget[i] = 150 + rng.IntN(450)
	}
	opts := Options{
		Batch: 4 + rng.IntN(13),
		Poll:  time.Duration(20+rng.IntN(230)) * time.Millisecond,
		// Concurrency 1 is each target's own Concurrency's fallback only.
		Concurrency: 1,
		StopGrace:   stressTimeout + time.Second,
	}
	if rng.IntN(2) == 0 {
		// Room to hold a claim through a 429's pause (else its rows run
		// short of lease and are released).
		opts.Lease = stressTimeout + recordTimeout + 5*time.Second
	}
	var rmu sync.Mutex
	jitter := rand.New(rand.NewPCG(seed, 0x717))
	opts.Rand = func() float64 {
		rmu.Lock()
		defer rmu.Unlock()
		return jitter.Float64()
	}
	upfront := 0.4 + 0.6*rng.Float64() // the share queued before the start
	wakes := rng.IntN(2) == 0
	// restart stops the dispatcher once a third of the rows queued upfront
	// are delivered, and starts a new one on the same store: the rows the
	// first claimed but did not send must be released, not left claimed
	// until their lease ends (see stressMaxGap).
	restart := rng.IntN(2) == 0
	for i, st := range targets {
		t.Logf("target %s: concurrency %d, %d rows, %d 429s, %d timeouts at most", st.name, st.conc, perTarget[i],
			st.budget.tooMany.Load(), st.budget.timeouts.Load())
	}
	t.Logf("batch %d, poll %v, lease %v (0: default), %.0f%% queued upfront, wake on queueing %v, restart %v",
		opts.Batch, opts.Poll, opts.Lease, 100*upfront, wakes, restart)

	// The rows, in the order they are queued: each target's, interleaved.
	var plan []stressRow
	for i, st := range targets {
		for k := range perTarget[i] {
			kind := "ok"
			switch {
			case k%97 == 13:
				kind = "bad"
			case k%131 == 29:
				kind = "doomed"
			}
			plan = append(plan, stressRow{target: st, event: fmt.Sprintf("%s_%s_%d", st.name, kind, k), kind: kind})
		}
	}
	rng.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })
	queue := func(rows []stressRow) map[string]bool {
		touched := map[string]bool{}
		for i := range rows {
			r := &rows[i]
			r.id = q.add(t, r.target.name, r.event, "contact.created", fmt.Sprintf(`{"id":%q}`, r.event))
			touched[r.target.name] = true
		}
		return touched
	}

	began := time.Now()
	queued := int(upfront * float64(len(plan)))
	queue(plan[:queued])
	var counts stressCounts
	d, stop := startStress(t, q, &counts, targets, defs, opts)
	delivered := func() int {
		n := 0
		for _, st := range targets {
			n += q.deliveredOf(st.name)
		}
		return n
	}
	if restart {
		want := queued / 3
		q.waitFor(t, 30*time.Second, fmt.Sprintf("%d of %d rows delivered", want, queued), func() bool { return delivered() >= want })
		stop() // lets the requests in flight finish (StopGrace), records them, releases the rest
		t.Logf("restarted with %d rows delivered", delivered())
		d, stop = startStress(t, q, &counts, targets, defs, opts)
	}
	// The rest comes in chunks, each once half the rows queued so far are
	// delivered, so that rows come while claims, refills and retries go on.
	for queued < len(plan) {
		want := queued / 2
		q.waitFor(t, 30*time.Second, fmt.Sprintf("%d of %d rows delivered", want, queued), func() bool { return delivered() >= want })
		n := min(len(plan)-queued, 1+rng.IntN(len(plan)/8+1))
		touched := queue(plan[queued : queued+n])
		queued += n
		if wakes {
			for name := range touched {
				d.Wake(name)
			}
		}
	}
	q.waitFor(t, 60*time.Second, "every row delivered or dead-lettered", func() bool {
		for _, st := range targets {
			s, err := q.db.TargetQueue(context.Background(), st.name, true)
			if err != nil {
				t.Fatalf("read queue of %s: %v", st.name, err)
			}
			if s.Pending+s.Retrying > 0 {
				return false
			}
		}
		return true
	})
	took := time.Since(began)
	stop() // any request sent late (after a 2xx, say) is in now
	t.Logf("%d rows over %d targets done in %v: %d claims took %d rows, %d releases gave back %d",
		len(plan), len(targets), took.Round(time.Millisecond), counts.claims.Load(), counts.claimed.Load(),
		counts.releases.Load(), counts.released.Load())
	checkStress(t, q, targets, plan)
}

// startStress runs a dispatcher over q for targets (defs) with opts,
// counting each target's requests in flight on its transport; stop ends
// it and waits for Run to return (also done at the test's end).
func startStress(t *testing.T, q *storeQueue, counts *stressCounts, targets []*stressTarget, defs []Target, opts Options) (*Dispatcher, func()) {
	t.Helper()
	d, err := New(&countingQueue{storeQueue: q, counts: counts}, defs, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	for _, st := range targets {
		c := d.byName[st.name].client
		c.Transport = stressTransport{st: st, base: c.Transport}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Errorf("Run did not return within 20 s of its cancel")
			}
		})
	}
	t.Cleanup(stop)
	return d, stop
}

// checkStress checks each row's end against what its target saw.
func checkStress(t *testing.T, q *storeQueue, targets []*stressTarget, plan []stressRow) {
	t.Helper()
	byEvent := map[string][]stressHit{}
	known := map[string]bool{}
	for _, r := range plan {
		known[r.event] = true
	}
	errs := 0
	fail := func(format string, args ...any) {
		t.Helper()
		if errs++; errs <= 40 {
			t.Errorf(format, args...)
		}
	}
	kinds := map[string]int{}
	for _, st := range targets {
		st.mu.Lock()
		hits := append([]stressHit(nil), st.hits...)
		st.mu.Unlock()
		for _, h := range hits {
			kinds[h.kind]++
			if !known[h.event] {
				fail("%s: a request for %q, which no row of it holds", st.name, h.event)
			}
		}
		// Per event, in the order they arrived (a row's requests never
		// overlap: see rowTwice).
		sortHits(hits)
		for _, h := range hits {
			byEvent[h.event] = append(byEvent[h.event], h)
		}
		if m := st.client.most.Load(); int(m) > st.conc {
			fail("%s: %d requests in flight at once (its transport), want at most %d", st.name, m, st.conc)
		}
		if m := st.server.most.Load(); int(m) > st.conc {
			fail("%s: %d requests in flight at once (its server), want at most %d", st.name, m, st.conc)
		}
		st.rowMu.Lock()
		if len(st.rowTwice) > 0 {
			fail("%s: rows sent while a request for them was in flight: %v", st.name, st.rowTwice)
		}
		st.rowMu.Unlock()
		// After a 429 no request is sent to its target until the pause
		// (Retry-After: 1) ends; those sent before the dispatcher saw it
		// arrive within stressPauseSlack.
		for _, p := range hits {
			if p.status != http.StatusTooManyRequests {
				continue
			}
			for _, h := range hits {
				if h.arrived.After(p.answered.Add(stressPauseSlack)) && h.arrived.Before(p.answered.Add(time.Second)) {
					fail("%s: %s (attempt %d) arrived %v after the 429 to %s, within its Retry-After: 1",
						st.name, h.event, h.attempt, h.arrived.Sub(p.answered), p.event)
				}
			}
		}
	}
	t.Logf("answers: %v", kinds)

	for _, r := range plan {
		row := q.row(t, r.id)
		as := q.attemptsOf(t, r.id)
		hits := byEvent[r.event]
		if len(hits) == 0 {
			fail("%s: never sent (row %+v)", r.event, row)
			continue
		}
		var want string
		switch r.kind {
		case "ok":
			want = StatusDelivered
		case "bad", "doomed":
			want = StatusDeadLetter
		}
		if row.Status != want {
			fail("%s: %s after %d requests %v, want %s", r.event, row.Status, len(hits), hitCodes(hits), want)
		}
		if got, seen := fmt.Sprint(codes(as)), fmt.Sprint(hitCodes(hits)); got != seen {
			fail("%s: attempts logged %s, but the target saw %s", r.event, got, seen)
		}
		if row.Attempts != len(hits) || row.LastStatus != hits[len(hits)-1].status {
			fail("%s: row has %d attempts, last status %d; the target saw %v", r.event, row.Attempts, row.LastStatus, hitCodes(hits))
		}
		for i, a := range as {
			if a.Attempt != i+1 {
				fail("%s: attempt %d logged as attempt %d", r.event, i+1, a.Attempt)
			}
		}
		failures := 0
		for i, h := range hits {
			if h.attempt != i+1 {
				fail("%s: request %d sent as %s %d", r.event, i+1, HeaderDeliveryAttempt, h.attempt)
			}
			if i > 0 {
				prev := hits[i-1]
				if gap := h.arrived.Sub(prev.answered); gap > stressMaxGap {
					fail("%s: request %d came %v after request %d was answered (%v): left claimed until its lease ended?",
						r.event, i+1, gap.Round(time.Millisecond), i, hitCodes(hits))
				}
				switch {
				case prev.status >= 200 && prev.status <= 299:
					fail("%s: sent again (request %d, %v) after its %d", r.event, i+1, hitCodes(hits), prev.status)
				case prev.status == http.StatusTooManyRequests:
					if gap := h.arrived.Sub(prev.answered); gap < time.Second {
						fail("%s: resent %v after its 429, within Retry-After: 1", r.event, gap)
					}
				case failures >= 1 && failures <= len(stressSchedule):
					step := time.Duration(float64(stressSchedule[failures-1]) * (1 - jitter))
					if gap := h.arrived.Sub(prev.arrived); gap < step {
						fail("%s: failure %d retried after %v, want at least %v", r.event, failures, gap, step)
					}
				}
			}
			if h.status == 0 || h.status >= 300 && h.status != http.StatusTooManyRequests {
				failures++
			}
		}
		switch r.kind {
		case "bad":
			if len(hits) != 1 {
				fail("%s: a 400 dead-letters, but it was sent %d times: %v", r.event, len(hits), hitCodes(hits))
			}
		case "doomed":
			if len(hits) != len(stressSchedule)+1 {
				fail("%s: 500 every time dead-letters after %d attempts, it got %d: %v", r.event, len(stressSchedule)+1, len(hits), hitCodes(hits))
			}
		}
	}
	if errs > 40 {
		t.Errorf("... and %d more", errs-40)
	}
}

func hitCodes(hits []stressHit) []int {
	out := make([]int, len(hits))
	for i, h := range hits {
		out[i] = h.status
	}
	return out
}

// sortHits orders hits by arrival.
func sortHits(hits []stressHit) {
	slices.SortStableFunc(hits, func(a, b stressHit) int { return a.arrived.Compare(b.arrived) })
}

// stressCounts counts the dispatcher's claims and releases.
type stressCounts struct{ claims, claimed, releases, released atomic.Int64 }

// countingQueue is a storeQueue that counts claims and releases.
type countingQueue struct {
	*storeQueue
	counts *stressCounts
}

func (q *countingQueue) ClaimDue(ctx context.Context, target string, now time.Time, limit int, lease time.Duration) ([]Row, error) {
	rows, err := q.storeQueue.ClaimDue(ctx, target, now, limit, lease)
	q.counts.claims.Add(1)
	q.counts.claimed.Add(int64(len(rows)))
	return rows, err
}

func (q *countingQueue) Release(ctx context.Context, rows []Row, lease, now time.Time) error {
	q.counts.releases.Add(1)
	q.counts.released.Add(int64(len(rows)))
	return q.storeQueue.Release(ctx, rows, lease, now)
}
