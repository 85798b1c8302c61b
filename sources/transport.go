package sources

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources/governor"
)

// callStats counts the HTTP attempts of one call (List or Get, retries
// included). The governed transport finds it in the request context.
type callStats struct {
	mu           sync.Mutex
	requests     int
	rateLimited  int
	throttleWait time.Duration
}

type callStatsKey struct{}

func withCallStats(ctx context.Context, st *callStats) context.Context {
	return context.WithValue(ctx, callStatsKey{}, st)
}

func callStatsFrom(ctx context.Context) *callStats {
	st, _ := ctx.Value(callStatsKey{}).(*callStats)
	return st
}

func (st *callStats) cost() backstop.Cost {
	st.mu.Lock()
	defer st.mu.Unlock()
	return backstop.Cost{Requests: st.requests, RateLimited: st.rateLimited, ThrottleWait: st.throttleWait}
}

// errGovernor marks a request the rate-limit governor could not admit for a
// reason other than the context ending (e.g. its shared store failed).
var errGovernor = errors.New("rate-limit governor")

type governorError struct{ err error }

func (e *governorError) Error() string { return errGovernor.Error() + ": " + e.err.Error() }
func (e *governorError) Unwrap() []error {
	return []error{errGovernor, e.err}
}

// governedTransport sends every HTTP attempt through the governor: Acquire
// before, Done (with the response's headers) or Abort after. The per-attempt
// timeout starts once the governor admits the request, so throttle waits do
// not eat into it.
type governedTransport struct {
	next    http.RoundTripper
	gov     *governor.Governor
	timeout time.Duration
}

// RoundTrip implements http.RoundTripper.
func (t *governedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	st := callStatsFrom(ctx)
	began := time.Now()
	tk, err := t.gov.Acquire(ctx)
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		if st != nil {
			// Waited for the governor all the same (a run stopped
			// while it waited for its first request's turn).
			st.mu.Lock()
			st.throttleWait += time.Since(began)
			st.mu.Unlock()
		}
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, &governorError{err}
	}
	if st != nil {
		st.mu.Lock()
		st.requests++
		st.throttleWait += tk.Waited()
		st.mu.Unlock()
	}
	cancel := context.CancelFunc(func() {})
	if t.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, t.timeout)
		req = req.WithContext(ctx)
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		cancel()
		tk.Abort()
		return nil, err
	}
	tk.Done(resp.StatusCode, resp.Header)
	if resp.StatusCode == http.StatusTooManyRequests && st != nil {
		st.mu.Lock()
		st.rateLimited++
		st.mu.Unlock()
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelOnClose ends a request's timeout context once its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}
