package sim

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/backstop-sync/backstop"
)

// The API's page sizes.
const (
	DefaultPageSize = 20
	MaxPageSize     = 200
)

// pathPrefix is where the API lives.
const pathPrefix = "/public/v1/"

// Handler returns the HTTP handler serving the API contract. Checks run in
// this order: auth (401), rate limit (429), error injection (5xx), latency,
// then the request itself.
func (s *Sim) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

func (s *Sim) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r) {
		s.rl.Lock()
		s.stats.Unauthorized++
		s.rl.Unlock()
		if s.delay(r.Context()) {
			writeError(w, http.StatusUnauthorized, "unauthorized", "missing or wrong API key")
		}
		return
	}
	now := s.now()
	a := s.admit(now)
	h := w.Header()
	// The platform's own clock, which its X-RateLimit-Reset and
	// Retry-After dates are in (net/http's would be the real one).
	h.Set("Date", now.UTC().Format(http.TimeFormat))
	h.Set("X-RateLimit-Limit", strconv.Itoa(a.limit))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(a.remaining))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(a.reset, 10))
	if !s.delay(r.Context()) {
		return
	}
	switch {
	case a.retryAfter != "":
		h.Set("Retry-After", a.retryAfter)
		writeError(w, http.StatusTooManyRequests, "rate_limited", "rate limit exceeded; retry after the window resets")
	case a.fail != 0:
		writeError(w, a.fail, failCodes[a.fail], "injected failure")
	default:
		s.route(w, r)
	}
}

var failStatuses = []int{http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable}

var failCodes = map[int]string{
	http.StatusInternalServerError: "internal_error",
	http.StatusBadGateway:          "bad_gateway",
	http.StatusServiceUnavailable:  "unavailable",
}

func (s *Sim) authorized(r *http.Request) bool {
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(key), []byte(s.apiKey)) == 1
}

// delay waits Latency; it reports false when the request was cancelled.
func (s *Sim) delay(ctx context.Context) bool {
	if s.latency <= 0 {
		return true
	}
	t := time.NewTimer(s.latency)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// admission is the rate limiter's and the error injector's decision on one
// authorised request.
type admission struct {
	limit, remaining int
	reset            int64  // Unix seconds
	retryAfter       string // set on a 429
	fail             int    // injected 5xx status, or 0
}

// admit counts one authorised request at now in its fixed window.
func (s *Sim) admit(now time.Time) admission {
	s.rl.Lock()
	defer s.rl.Unlock()
	s.stats.Requests++
	sec := now.Unix()
	start := sec - ((sec%s.window)+s.window)%s.window // floor to a window multiple
	end := start + s.window
	key := windowKey{start, s.window}
	i, ok := s.winIdx[key]
	if !ok {
		i = len(s.stats.Windows)
		s.winIdx[key] = i
		s.stats.Windows = append(s.stats.Windows, WindowStat{Start: time.Unix(start, 0).UTC(), Length: time.Duration(s.window) * time.Second})
	}
	ws := &s.stats.Windows[i]
	a := admission{limit: s.limit, reset: end}
	if s.limit > 0 && ws.Requests >= s.limit {
		ws.RateLimited++
		s.stats.RateLimited++
		a.retryAfter = s.retryAfterValue(now, time.Unix(end, 0).UTC())
		s.n429++
		return a
	}
	ws.Requests++
	if s.limit == 0 {
		a.limit = UnlimitedLimit
	}
	a.remaining = max(a.limit-ws.Requests, 0)
	if s.errorRate > 0 && s.errRng.Float64() < s.errorRate {
		a.fail = failStatuses[s.errRng.IntN(len(failStatuses))]
		s.stats.Errors++
	}
	return a
}

// retryAfterValue renders the wait until end in the configured form.
func (s *Sim) retryAfterValue(now, end time.Time) string {
	form := s.retryAfterF
	if form == RetryAfterMixed {
		form = []string{RetryAfterSeconds, RetryAfterDate, RetryAfterRFC850, RetryAfterAsctime}[s.n429%4]
	}
	switch form {
	case RetryAfterDate:
		return end.Format(http.TimeFormat)
	case RetryAfterRFC850:
		return end.Format("Monday, 02-Jan-06 15:04:05 GMT")
	case RetryAfterAsctime:
		return end.Format(time.ANSIC)
	}
	secs := (end.Sub(now) + time.Second - 1) / time.Second
	return strconv.FormatInt(int64(max(secs, 1)), 10)
}

func (s *Sim) route(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "only GET is supported")
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, pathPrefix)
	name, id, hasID := strings.Cut(rest, "/")
	res := backstop.Resource(name)
	if !ok || !res.Valid() || (hasID && (id == "" || strings.Contains(id, "/"))) {
		writeError(w, http.StatusNotFound, "not_found", "no such endpoint: "+r.URL.Path)
		return
	}
	if hasID {
		s.serveObject(w, res, id)
		return
	}
	s.serveList(w, r, res)
}

func (s *Sim) serveObject(w http.ResponseWriter, res backstop.Resource, id string) {
	s.mu.RLock()
	rec, ok := s.feeds[res].byID[id]
	s.mu.RUnlock()
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no %s object with id %q", res, id))
		return
	}
	writeJSON(w, http.StatusOK, rec.data)
}

func (s *Sim) serveList(w http.ResponseWriter, r *http.Request, res backstop.Resource) {
	q := r.URL.Query()
	limit := DefaultPageSize
	if v := q.Get("cursor_limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxPageSize {
			writeError(w, http.StatusBadRequest, "invalid_limit", fmt.Sprintf("cursor_limit %q: want an integer in 1..%d", v, MaxPageSize))
			return
		}
		limit = n
	}
	var since int64
	hasSince := false
	if v := q.Get("since"); v != "" {
		t, err := backstop.ParseTime(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_since", fmt.Sprintf("since %q: want an RFC 3339 timestamp", v))
			return
		}
		since, hasSince = unixNanos(t), true
	}
	raw := q.Get("cursor")
	var cur cursor
	if raw != "" {
		var err error
		if cur, err = decodeCursor(raw); err != nil || cur.res != resourceIndex(res) {
			writeError(w, http.StatusBadRequest, "invalid_cursor", "cursor cannot be read")
			return
		}
	}

	var page [][]byte
	var last *record
	s.mu.RLock()
	gen := s.cgen
	f := s.feeds[res]
	stale := raw != "" && cur.gen != gen
	start, end, total := 0, 0, len(f.recs)
	if !stale {
		if cur.hasPos {
			start = f.after(cur.ts, cur.id)
		}
		if hasSince {
			start = max(start, f.atOrAfter(since))
		}
		end = min(start+limit, total)
		page = make([][]byte, 0, end-start)
		for _, rec := range f.recs[start:end] {
			page = append(page, rec.data)
		}
		if end > start {
			last = f.recs[end-1]
		}
	}
	s.mu.RUnlock()
	if stale {
		writeError(w, http.StatusBadRequest, "invalid_cursor", "cursor has expired; start again from the beginning or from since")
		return
	}

	next := raw
	switch {
	case last != nil:
		next = cursor{res: resourceIndex(res), gen: gen, hasPos: true, ts: last.ts, id: last.id}.encode()
	case raw == "" && hasSince:
		// Just before since: (since, "") precedes every object updated at since.
		next = cursor{res: resourceIndex(res), gen: gen, hasPos: true, ts: since}.encode()
	case raw == "":
		next = cursor{res: resourceIndex(res), gen: gen}.encode()
	}
	hasMore := "false"
	if end < total {
		hasMore = "true"
	}
	// The body is assembled from the pre-encoded objects; the cursor is
	// base64url, which needs no JSON escaping.
	size := len(`{"data":[],"meta":{"next_cursor":"","has_more":false}}`) + len(next) + len(page)
	for _, d := range page {
		size += len(d)
	}
	body := make([]byte, 0, size)
	body = append(body, `{"data":[`...)
	for i, d := range page {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, d...)
	}
	body = append(body, `],"meta":{"next_cursor":"`...)
	body = append(body, next...)
	body = append(body, `","has_more":`...)
	body = append(body, hasMore...)
	body = append(body, `}}`...)
	writeJSON(w, http.StatusOK, body)
}

// unixNanos is t in Unix nanoseconds, clamped to the int64 range.
func unixNanos(t time.Time) int64 {
	switch {
	case t.Year() < 1678:
		return math.MinInt64
	case t.Year() > 2261:
		return math.MaxInt64
	}
	return t.UnixNano()
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	type apiError struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	body, _ := json.Marshal(struct {
		Error apiError `json:"error"`
	}{apiError{code, msg}})
	writeJSON(w, status, body)
}

// Run makes mutations at Options.MutationRate per second until ctx is done.
// With a zero rate it makes none and only waits for ctx. With a WebhookURL
// it starts the webhook sender (see StartWebhooks) for ctx and, when it
// started it, returns only after its senders have stopped.
func (s *Sim) Run(ctx context.Context) {
	if s.startWebhooks(ctx) {
		defer s.waitWebhooks()
	}
	if s.mutRate <= 0 {
		<-ctx.Done()
		return
	}
	period := max(time.Duration(float64(time.Second)/s.mutRate), 10*time.Millisecond)
	t := time.NewTicker(period)
	defer t.Stop()
	prev := time.Now()
	var due float64
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			due += s.mutRate * now.Sub(prev).Seconds()
			prev = now
			if n := int(due); n > 0 {
				due -= float64(n)
				s.Mutate(n)
			}
		}
	}
}

// Serve serves the API on ln until ctx is done, then shuts the server down
// gracefully (waiting up to 5 s for requests in flight) and returns nil.
// When MutationRate is set it runs Run alongside; with a WebhookURL it
// sends webhooks (see StartWebhooks) until it returns. It returns the
// server's error if serving fails for another reason.
func (s *Sim) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	if s.startWebhooks(ctx) {
		wg.Go(func() { <-ctx.Done(); s.waitWebhooks() })
	}
	if s.mutRate > 0 {
		wg.Go(func() { s.Run(ctx) })
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	var err error
	select {
	case err = <-errc:
		cancel()
	case <-ctx.Done():
		sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		err = srv.Shutdown(sctx)
		scancel()
		if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
			err = serr
		}
	}
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("sim: serve: %w", err)
	}
	return nil
}
