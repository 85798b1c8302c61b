package sources

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/backstop-sync/backstop"
)

// retryPolicy decides the retries of one call. 5xx answers and network
// errors are retried up to max5xx times with full-jitter exponential backoff;
// 429s are retried at once (the governor has already paused the key) up to
// max429 times in a row; nothing else is retried.
type retryPolicy struct {
	max5xx, max429 int
	rand           func() float64
	now            func() time.Time

	failures    int // 5xx answers and network errors so far
	consecutive int // 429 answers since the last other answer

	// stats, when set, counts each backoff as throttle wait: the waits
	// between a call's attempts, besides the governor's own.
	stats *callStats
}

// checkRetry is the call's retryablehttp.CheckRetry.
func (p *retryPolicy) checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if err != nil {
		if !retryableNetErr(err) {
			return false, err
		}
		p.failures++
		return p.failures <= p.max5xx, nil
	}
	switch s := resp.StatusCode; {
	case s == http.StatusTooManyRequests:
		p.consecutive++
		return p.consecutive <= p.max429, nil
	case s >= 500 && s != http.StatusNotImplemented:
		p.consecutive = 0
		p.failures++
		return p.failures <= p.max5xx, nil
	default:
		p.consecutive = 0
		return false, nil
	}
}

// backoff is the call's retryablehttp.Backoff. A 503 with Retry-After waits
// at least that long (within max).
func (p *retryPolicy) backoff(lo, hi time.Duration, _ int, resp *http.Response) time.Duration {
	if resp != nil && resp.StatusCode == http.StatusTooManyRequests {
		return 0 // the governor holds the key until Retry-After
	}
	d := fullJitter(lo, hi, p.failures-1, p.rand())
	if resp != nil && resp.StatusCode == http.StatusServiceUnavailable {
		if ra, ok := backstop.RetryAfterIn(resp.Header, p.now()); ok {
			d = max(d, min(ra, hi))
		}
	}
	if p.stats != nil {
		p.stats.mu.Lock()
		p.stats.throttleWait += d
		p.stats.mu.Unlock()
	}
	return d
}

// fullJitter is exponential backoff with full jitter: a uniform draw (r in
// [0, 1)) from [0, min(hi, lo·2^n)].
func fullJitter(lo, hi time.Duration, n int, r float64) time.Duration {
	ceil := lo
	for i := 0; i < n && ceil < hi; i++ {
		ceil *= 2
	}
	ceil = min(ceil, hi)
	return time.Duration(r * float64(ceil))
}

// retryableNetErr reports whether a transport error may pass on retry: not
// when the governor failed, nor a certificate the server will present again.
func retryableNetErr(err error) bool {
	var cert *tls.CertificateVerificationError
	return !errors.Is(err, errGovernor) && !errors.As(err, &cert)
}

// retryLogger adapts slog to retryablehttp.LeveledLogger. The library
// reports every failed attempt as an error; those are retried, so they are
// logged as warnings, and the call's final error is the caller's to report.
type retryLogger struct{ l *slog.Logger }

func (r retryLogger) Error(msg string, kv ...any) { r.l.Warn(msg, kv...) }
func (r retryLogger) Warn(msg string, kv ...any)  { r.l.Warn(msg, kv...) }
func (r retryLogger) Info(msg string, kv ...any)  { r.l.Info(msg, kv...) }
func (r retryLogger) Debug(msg string, kv ...any) { r.l.Debug(msg, kv...) }
