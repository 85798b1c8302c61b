package sources

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources/governor"
)

const testKey = "sk_live_TOPSECRET_0123456789"

// start is the fake clock's start, on a whole second as the platform's
// X-RateLimit-Reset is.
var start = time.Unix(1_700_000_000, 0)

// fakeClock moves time forward as soon as the governor sleeps, so that
// throttle waits are exact and instant.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d > 0 {
		c.now = c.now.Add(d)
	}
	return ctx.Err()
}

type harness struct {
	client   *Client
	gov      *governor.Governor
	logs     *bytes.Buffer
	requests atomic.Int32
}

// newHarness serves h on a real HTTP server and returns a client for it with
// a governor on a fake clock (no jitter), tiny retry waits and a debug log.
func newHarness(t *testing.T, h http.HandlerFunc, edit func(*Options)) *harness {
	t.Helper()
	hs := &harness{logs: &bytes.Buffer{}}
	clock := &fakeClock{now: start}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hs.requests.Add(1)
		// The platform's clock is the fake one, as its X-RateLimit-Reset
		// values are.
		w.Header().Set("Date", clock.Now().UTC().Format(http.TimeFormat))
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	log := slog.New(slog.NewJSONHandler(&lockedWriter{w: hs.logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	hs.gov = governor.New(testKey, governor.Options{
		Limit: 1000, Window: time.Second, Clock: clock,
		Rand: func() float64 { return 0 }, Logger: log,
	})
	opts := Options{
		BaseURL: srv.URL + "/", APIKey: testKey, Governor: hs.gov, Logger: log,
		RetryMax: 3, RetryWaitMin: time.Millisecond, RetryWaitMax: 2 * time.Millisecond, Max429: 2,
	}
	if edit != nil {
		edit(&opts)
	}
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	hs.client = c
	return hs
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"code":%q,"message":%q}}`, code, msg)
}

func TestListDecodesPageKeepingRawBytes(t *testing.T) {
	// Odd spacing and key order must survive: the mirror stores what was sent.
	obj1 := `{ "updated_at":"2025-03-01T10:00:00.123456Z",  "id":"ct_1", "name":"Ann",
		"email":null }`
	obj2 := `{"id":"ct_2","updated_at":"2025-03-01T10:00:01Z","tags":["a", "b"]}`
	var got http.Request
	hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		got = *r
		fmt.Fprintf(w, `{"data":[%s,%s],"meta":{"next_cursor":"cur_2","has_more":true}}`, obj1, obj2)
	}, nil)

	since := time.Date(2025, 3, 1, 13, 0, 0, 500, time.FixedZone("CET", 3600))
	page, err := hs.client.List(context.Background(), backstop.ListRequest{Resource: backstop.Contacts, Cursor: "cur_1", Since: since})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Objects) != 2 || string(page.Objects[0].Data) != obj1 || string(page.Objects[1].Data) != obj2 {
		t.Fatalf("objects = %+v", page.Objects)
	}
	o := page.Objects[0]
	if o.ID != "ct_1" || o.Resource != backstop.Contacts || !o.UpdatedAt.Equal(time.Date(2025, 3, 1, 10, 0, 0, 123456000, time.UTC)) {
		t.Errorf("object head = %+v", o)
	}
	if page.NextCursor != "cur_2" || !page.HasMore || page.Cost != (backstop.Cost{Requests: 1}) {
		t.Errorf("page = cursor %q, more %v, cost %+v", page.NextCursor, page.HasMore, page.Cost)
	}
	q := got.URL.Query()
	if got.URL.Path != "/public/v1/contacts" || q.Get("cursor") != "cur_1" || q.Get("cursor_limit") != "20" ||
		q.Get("since") != "2025-03-01T12:00:00.0000005Z" {
		t.Errorf("request = %s", got.URL)
	}
	if got.Header.Get("Authorization") != "Bearer "+testKey {
		t.Errorf("Authorization = %q", got.Header.Get("Authorization"))
	}
}

func TestListPageSize(t *testing.T) {
	var limits []string
	hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		limits = append(limits, r.URL.Query().Get("cursor_limit"))
		if _, ok := r.URL.Query()["cursor"]; ok {
			t.Errorf("empty cursor sent: %s", r.URL)
		}
		fmt.Fprint(w, `{"data":[],"meta":{"next_cursor":"c","has_more":false}}`)
	}, func(o *Options) { o.PageSize = 150 })
	for _, n := range []int{0, 7, 500} {
		if _, err := hs.client.List(context.Background(), backstop.ListRequest{Resource: backstop.Chats, Limit: n}); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(limits, ",") != "150,7,200" {
		t.Errorf("cursor_limit sent = %v, want 150,7,200", limits)
	}
}

func TestListEmptyPageKeepsCursor(t *testing.T) {
	for _, body := range []string{
		`{"data":[],"meta":{"next_cursor":"","has_more":false}}`,
		`{"data":[],"meta":{}}`,
		`{"data":[],"meta":{"next_cursor":"cur_9","has_more":true}}`,
	} {
		hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, body) }, nil)
		page, err := hs.client.List(context.Background(), backstop.ListRequest{Resource: backstop.Payments, Cursor: "cur_9"})
		if err != nil {
			t.Fatal(err)
		}
		if page.NextCursor != "cur_9" || page.HasMore || len(page.Objects) != 0 {
			t.Errorf("%s: page = %+v, want cursor kept, no more", body, page)
		}
	}
}

func TestListBadBody(t *testing.T) {
	for _, body := range []string{
		`<html>oops</html>`,
		`{"data":[{"id":"ct_1"}],"meta":{"next_cursor":"x"}}`,
		`{"data":[{"id":"ct_1","updated_at":"2025-03-01T10:00:00Z"}],"meta":{"has_more":true}}`,
		// Not a page at all (a base_url that is not the API's, answering
		// 200 to every path): it was taken for an empty last page, and a
		// first backfill was marked done with nothing read.
		`{"ok":true}`,
		`{"data":null,"meta":{"next_cursor":"","has_more":false}}`,
		`{"data":[]}`,
		`{"data":{},"meta":{}}`,
		`{"data":[],"meta":null}`,
		`[]`,
	} {
		hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, body) }, nil)
		page, err := hs.client.List(context.Background(), backstop.ListRequest{Resource: backstop.Contacts, Cursor: "c1"})
		if !errors.Is(err, backstop.ErrUnavailable) || page.Cost.Requests != 1 {
			t.Errorf("%s: err = %v, cost %+v", body, err, page.Cost)
		}
	}
}

func TestUnauthorizedStopsAtOnce(t *testing.T) {
	hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusUnauthorized, "unauthorized", "invalid API key")
	}, nil)
	page, err := hs.client.List(context.Background(), backstop.ListRequest{Resource: backstop.Contacts})
	if !errors.Is(err, backstop.ErrUnauthorized) {
		t.Fatalf("err = %v, want ErrUnauthorized", err)
	}
	if n := hs.requests.Load(); n != 1 || page.Cost.Requests != 1 {
		t.Errorf("requests = %d (cost %d), want 1", n, page.Cost.Requests)
	}
	if !strings.Contains(err.Error(), "check source.api_key") || !strings.Contains(err.Error(), "HTTP 401") {
		t.Errorf("error %q should point at source.api_key", err)
	}
}

func TestInvalidCursorNamesResourceAndCursor(t *testing.T) {
	hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusBadRequest, "invalid_cursor", "cursor cannot be decoded")
	}, nil)
	_, err := hs.client.List(context.Background(), backstop.ListRequest{Resource: backstop.Messages, Cursor: "bm90LWEtY3Vyc29y"})
	var ae *backstop.APIError
	if !errors.As(err, &ae) || !errors.Is(err, backstop.ErrInvalidCursor) {
		t.Fatalf("err = %v, want *APIError wrapping ErrInvalidCursor", err)
	}
	if ae.Resource != backstop.Messages || ae.Cursor != "bm90LWEtY3Vyc29y" || ae.Code != "invalid_cursor" || ae.Retryable() {
		t.Errorf("APIError = %+v", ae)
	}
	for _, want := range []string{"messages", `"bm90LWEtY3Vyc29y"`, "cursor cannot be decoded"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if hs.requests.Load() != 1 {
		t.Errorf("requests = %d, want 1", hs.requests.Load())
	}
}

func TestOther4xxIsNotRetried(t *testing.T) {
	hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusForbidden, "forbidden", "plan does not include payments")
	}, nil)
	_, err := hs.client.List(context.Background(), backstop.ListRequest{Resource: backstop.Payments})
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "HTTP 403 forbidden") ||
		!strings.Contains(err.Error(), "plan does not include payments") || hs.requests.Load() != 1 {
		t.Errorf("err = %v after %d requests", err, hs.requests.Load())
	}
}

func TestServerErrorStormExhaustsRetries(t *testing.T) {
	for _, status := range []int{500, 502, 503} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
				writeError(w, status, "internal", "database on fire "+strconv.Itoa(status))
			}, nil)
			page, err := hs.client.List(context.Background(), backstop.ListRequest{Resource: backstop.Contacts, Cursor: "c7"})
			var ae *backstop.APIError
			if !errors.As(err, &ae) || !errors.Is(err, backstop.ErrUnavailable) || !ae.Retryable() {
				t.Fatalf("err = %v, want retryable ErrUnavailable", err)
			}
			if ae.Status != status || !strings.Contains(err.Error(), "database on fire") {
				t.Errorf("error %q should carry the last status and message", err)
			}
			if n := hs.requests.Load(); n != 4 || page.Cost.Requests != 4 {
				t.Errorf("requests = %d (cost %d), want RetryMax+1 = 4", n, page.Cost.Requests)
			}
		})
	}
}

func TestServerErrorsThenSuccess(t *testing.T) {
	var n atomic.Int32
	hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) <= 2 {
			writeError(w, http.StatusServiceUnavailable, "unavailable", "try later")
			return
		}
		fmt.Fprint(w, `{"data":[{"id":"pay_1","updated_at":"2025-03-01T10:00:00Z","amount":100}],"meta":{"next_cursor":"p1","has_more":false}}`)
	}, nil)
	page, err := hs.client.List(context.Background(), backstop.ListRequest{Resource: backstop.Payments})
	if err != nil {
		t.Fatal(err)
	}
	if page.Cost.Requests != 3 || page.Cost.RateLimited != 0 || len(page.Objects) != 1 {
		t.Errorf("page = %+v", page)
	}
}

// The waits between a call's attempts after 5xx answers count as throttle
// wait, as the governor's own waits do.
func TestBackoffCountsAsThrottleWait(t *testing.T) {
	var n atomic.Int32
	hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) <= 2 {
			writeError(w, http.StatusServiceUnavailable, "unavailable", "try later")
			return
		}
		fmt.Fprint(w, `{"id":"ct_1","updated_at":"2025-03-01T10:00:00Z"}`)
	}, func(o *Options) { o.RetryWaitMin, o.RetryWaitMax = 20*time.Millisecond, 80*time.Millisecond })
	hs.client.rand = func() float64 { return 0.5 }
	began := time.Now()
	_, cost, err := hs.client.Get(context.Background(), backstop.Contacts, "ct_1")
	if err != nil {
		t.Fatal(err)
	}
	// Full jitter at one half: 10 ms after the first 503 (ceiling 20 ms),
	// 20 ms after the second (ceiling 40 ms); the governor's pacing of the
	// three attempts adds a little.
	if least := 30 * time.Millisecond; cost.Requests != 3 || cost.ThrottleWait < least || cost.ThrottleWait > least+10*time.Millisecond {
		t.Errorf("cost = %+v, want 3 requests and 30-40 ms throttled", cost)
	}
	// The backoffs are real waits (the governor's pacing is on the
	// harness's fake clock, so it takes no real time).
	if took := time.Since(began); took < 30*time.Millisecond {
		t.Errorf("the call took %v, less than the 30 ms of backoff it says it waited", took)
	}
}

func TestNetworkErrorsExhaustRetries(t *testing.T) {
	hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		// Hijack and drop the connection: no answer at all.
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}, nil)
	_, cost, err := hs.client.Get(context.Background(), backstop.Chats, "chat_1")
	var ae *backstop.APIError
	if !errors.As(err, &ae) || !errors.Is(err, backstop.ErrUnavailable) || ae.Status != 0 || ae.Message == "" {
		t.Fatalf("err = %v, want ErrUnavailable with the transport error", err)
	}
	if cost.Requests != 4 || hs.requests.Load() != 4 {
		t.Errorf("requests = %d (cost %d), want 4", hs.requests.Load(), cost.Requests)
	}
	if st, err := hs.gov.State(context.Background()); err != nil {
		t.Fatal(err)
	} else if st.InFlight != 0 {
		t.Errorf("governor still counts %d in flight", st.InFlight)
	}
}

// rateLimitHeaders are what the platform sends: a window of 100 ending one
// second after the fake clock's start.
func rateLimitHeaders(w http.ResponseWriter, remaining int) {
	w.Header().Set("X-RateLimit-Limit", "100")
	w.Header().Set("X-RateLimit-Remaining", strconv.Itoa(remaining))
	w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(start.Unix()+1, 10))
}

func TestRateLimitedThenSuccess(t *testing.T) {
	var n atomic.Int32
	hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			rateLimitHeaders(w, 0)
			w.Header().Set("Retry-After", "2")
			writeError(w, http.StatusTooManyRequests, "rate_limited", "slow down")
			return
		}
		rateLimitHeaders(w, 90)
		fmt.Fprint(w, `{"id":"ct_1","updated_at":"2025-03-01T10:00:00Z"}`)
	}, nil)
	obj, cost, err := hs.client.Get(context.Background(), backstop.Contacts, "ct_1")
	if err != nil {
		t.Fatal(err)
	}
	if obj.ID != "ct_1" || cost != (backstop.Cost{Requests: 2, RateLimited: 1, ThrottleWait: 2 * time.Second}) {
		t.Errorf("object %s, cost %+v: want 2 requests, 1 rate-limited, 2s throttled", obj.ID, cost)
	}
	st, _ := hs.gov.State(context.Background())
	if !st.PausedUntil.Equal(start.Add(2*time.Second)) || st.Consecutive429 != 0 || st.InFlight != 0 {
		t.Errorf("governor state = %+v: want paused until start+2s, 429s reset by the success", st)
	}
	if !strings.Contains(hs.logs.String(), "key paused") {
		t.Errorf("the pause is not logged:\n%s", hs.logs)
	}
}

func TestRateLimitedBeyondMax429(t *testing.T) {
	hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		rateLimitHeaders(w, 0)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusTooManyRequests, "rate_limited", "slow down")
	}, nil)
	page, err := hs.client.List(context.Background(), backstop.ListRequest{Resource: backstop.Contacts, Cursor: "c3"})
	if !errors.Is(err, backstop.ErrRateLimited) {
		t.Fatalf("err = %v, want ErrRateLimited", err)
	}
	// Max429 = 2: the first answer and two retries. Waits: 1s pause, then
	// 0.1s more for the window (Remaining 0) to reset past the margin, then
	// the doubled 2s pause.
	if page.Cost != (backstop.Cost{Requests: 3, RateLimited: 3, ThrottleWait: 3100 * time.Millisecond}) {
		t.Errorf("cost = %+v", page.Cost)
	}
	if st, _ := hs.gov.State(context.Background()); st.Consecutive429 != 3 {
		t.Errorf("consecutive 429s = %d, want 3", st.Consecutive429)
	}
}

func TestGetEscapesIDAndMapsNotFound(t *testing.T) {
	var path string
	hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		path = r.URL.EscapedPath()
		writeError(w, http.StatusNotFound, "not_found", "no such message")
	}, nil)
	_, cost, err := hs.client.Get(context.Background(), backstop.Messages, "msg_a/b c?")
	if !errors.Is(err, backstop.ErrNotFound) || cost.Requests != 1 {
		t.Fatalf("err = %v, cost %+v", err, cost)
	}
	if path != "/public/v1/messages/msg_a%2Fb%20c%3F" {
		t.Errorf("path = %s", path)
	}
	if !strings.Contains(err.Error(), "messages msg_a/b c?") {
		t.Errorf("error %q does not name the id", err)
	}
}

// A 410 is a deletion for good, told apart from a 404 (an object perhaps
// still on its way) by its own sentinel, so no caller retries it.
func TestGetMapsGone(t *testing.T) {
	hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusGone, "gone", "this message was deleted")
	}, nil)
	_, cost, err := hs.client.Get(context.Background(), backstop.Messages, "msg_1")
	if !errors.Is(err, backstop.ErrGone) || errors.Is(err, backstop.ErrNotFound) || cost.Requests != 1 {
		t.Fatalf("err = %v, cost %+v; want ErrGone after one request", err, cost)
	}
}

func TestGetRejectsOtherObject(t *testing.T) {
	hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"id":"ct_2","updated_at":"2025-03-01T10:00:00Z"}`)
	}, nil)
	if _, _, err := hs.client.Get(context.Background(), backstop.Contacts, "ct_1"); !errors.Is(err, backstop.ErrUnavailable) {
		t.Errorf("err = %v", err)
	}
}

func TestCancelledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		cancel()
		writeError(w, http.StatusServiceUnavailable, "unavailable", "down")
	}, func(o *Options) { o.RetryWaitMin, o.RetryWaitMax = time.Hour, time.Hour })
	page, err := hs.client.List(ctx, backstop.ListRequest{Resource: backstop.Contacts})
	var ae *backstop.APIError
	if !errors.Is(err, context.Canceled) || !errors.As(err, &ae) || ae.Retryable() {
		t.Fatalf("err = %v, want context.Canceled in an APIError", err)
	}
	if page.Cost.Requests != 1 || hs.requests.Load() != 1 {
		t.Errorf("requests = %d, want 1", hs.requests.Load())
	}
}

func TestRequestBodyRewoundOnRetry(t *testing.T) {
	var bodies []string
	var mu sync.Mutex
	hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, r.Method+" "+string(b))
		n := len(bodies)
		mu.Unlock()
		if n <= 2 {
			writeError(w, http.StatusBadGateway, "bad_gateway", "retry")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}, nil)
	payload := []byte(`{"hello":"world"}`)
	res, cost, err := hs.client.do(context.Background(), http.MethodPost, hs.client.base+"/echo", payload)
	if err != nil || res.status != http.StatusNoContent || cost.Requests != 3 {
		t.Fatalf("do = %+v, %+v, %v", res, cost, err)
	}
	want := "POST " + string(payload)
	if len(bodies) != 3 || bodies[0] != want || bodies[1] != want || bodies[2] != want {
		t.Errorf("bodies = %q, want %q three times", bodies, want)
	}
}

func TestAPIKeyNeverLeaks(t *testing.T) {
	// A platform that echoes the Authorization header back in its errors.
	echo := func(status int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if status == http.StatusTooManyRequests {
				w.Header().Set("Retry-After", "0")
			}
			writeError(w, status, "err", "you sent "+r.Header.Get("Authorization"))
		}
	}
	cases := map[string]http.HandlerFunc{
		"401": echo(401), "400": echo(400), "403": echo(403), "404": echo(404), "429": echo(429), "500": echo(500),
		"plain body": func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(502)
			fmt.Fprint(w, "upstream said: "+r.Header.Get("Authorization"))
		},
		"dropped": func(w http.ResponseWriter, r *http.Request) {
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		},
	}
	for name, h := range cases {
		t.Run(name, func(t *testing.T) {
			hs := newHarness(t, h, nil)
			_, err := hs.client.List(context.Background(), backstop.ListRequest{Resource: backstop.Contacts, Cursor: "c"})
			_, _, err2 := hs.client.Get(context.Background(), backstop.Contacts, "ct_1")
			if err == nil || err2 == nil {
				t.Fatal("want errors")
			}
			for _, s := range []string{err.Error(), err2.Error(), fmt.Sprintf("%+v", err), hs.logs.String()} {
				if strings.Contains(s, testKey) || strings.Contains(s, "TOPSECRET") {
					t.Errorf("API key leaked:\n%s", s)
				}
			}
			if name != "401" && name != "400" && name != "403" && name != "404" && hs.logs.Len() == 0 {
				t.Error("nothing logged: the check above proves nothing")
			}
		})
	}
}

func TestFullJitter(t *testing.T) {
	const lo, hi = 500 * time.Millisecond, 30 * time.Second
	tests := []struct {
		n    int
		r    float64
		want time.Duration
	}{
		{0, 0, 0},
		{0, 0.5, 250 * time.Millisecond},
		{0, 0.999, 499500 * time.Microsecond},
		{1, 0.5, 500 * time.Millisecond},
		{3, 0.5, 2 * time.Second},
		{6, 1, 30 * time.Second},  // 32s capped
		{60, 1, 30 * time.Second}, // no overflow
		{-1, 1, 500 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := fullJitter(lo, hi, tt.n, tt.r); got != tt.want {
			t.Errorf("fullJitter(n=%d, r=%v) = %v, want %v", tt.n, tt.r, got, tt.want)
		}
	}
}

func TestCheckRetry(t *testing.T) {
	resp := func(status int) *http.Response { return &http.Response{StatusCode: status} }
	p := &retryPolicy{max5xx: 2, max429: 1}
	ctx := context.Background()
	steps := []struct {
		resp *http.Response
		err  error
		want bool
	}{
		{resp(503), nil, true},
		{resp(429), nil, true},
		{resp(429), nil, false}, // second 429 in a row > max429
		{resp(500), nil, true},  // second failure, and 429s start over
		{resp(429), nil, true},
		{nil, errors.New("connection reset"), false}, // third failure > max5xx
	}
	for i, s := range steps {
		if got, err := p.checkRetry(ctx, s.resp, s.err); got != s.want || err != nil {
			t.Fatalf("step %d: retry = %v, %v; want %v", i, got, err, s.want)
		}
	}
	for _, status := range []int{200, 204, 301, 400, 401, 403, 404, 409, 501} {
		if ok, _ := (&retryPolicy{max5xx: 5, max429: 5}).checkRetry(ctx, resp(status), nil); ok {
			t.Errorf("status %d retried", status)
		}
	}
	if ok, _ := (&retryPolicy{max5xx: 5}).checkRetry(ctx, nil, &governorError{errors.New("redis down")}); ok {
		t.Error("governor failure retried")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if ok, err := (&retryPolicy{max5xx: 5}).checkRetry(cctx, resp(503), nil); ok || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: retry = %v, %v", ok, err)
	}
}

func TestNewValidates(t *testing.T) {
	ok := Options{BaseURL: "https://api.example.com", APIKey: "k"}
	for name, edit := range map[string]func(*Options){
		"no base URL":       func(o *Options) { o.BaseURL = "" },
		"relative URL":      func(o *Options) { o.BaseURL = "api.example.com" },
		"ftp":               func(o *Options) { o.BaseURL = "ftp://api.example.com" },
		"credentials":       func(o *Options) { o.BaseURL = "https://user:pw@api.example.com" },
		"query":             func(o *Options) { o.BaseURL = "https://api.example.com/?key=k" },
		"no key":            func(o *Options) { o.APIKey = "" },
		"page size 201":     func(o *Options) { o.PageSize = 201 },
		"waits upside down": func(o *Options) { o.RetryWaitMin, o.RetryWaitMax = time.Second, time.Millisecond },
	} {
		o := ok
		edit(&o)
		if _, err := New(o); err == nil {
			t.Errorf("%s: New accepted %+v", name, o)
		} else if strings.Contains(err.Error(), "pw") {
			t.Errorf("%s: error leaks the password: %v", name, err)
		}
	}
	c, err := New(ok)
	if err != nil {
		t.Fatal(err)
	}
	if c.opts.PageSize != 20 || c.opts.RetryMax != 5 || c.opts.Max429 != 10 || c.opts.Timeout != 30*time.Second ||
		c.opts.RetryWaitMin != 500*time.Millisecond || c.opts.RetryWaitMax != 30*time.Second || c.Governor() == nil {
		t.Errorf("defaults = %+v", c.opts)
	}
}

func TestErrorBodyFallback(t *testing.T) {
	c := &Client{opts: Options{APIKey: "key"}}
	for body, want := range map[string][2]string{
		`{"error":{"code":"x","message":"m"}}`: {"x", "m"},
		"plain\n\ttext  here":                  {"", "plain text here"},
		strings.Repeat("é", 400):               {"", strings.Repeat("é", maxMessage) + "…"},
		`{"other":1}`:                          {"", `{"other":1}`},
	} {
		code, msg := c.platformMessage([]byte(body))
		if code != want[0] || msg != want[1] {
			t.Errorf("platformMessage(%.20q) = %q, %q", body, code, msg)
		}
	}
}

// A request abandoned because its run was cancelled (Ctrl-C) used to be
// logged as a failure ("request failed … context canceled") right before
// the run's own "interrupted"; it is not logged as a failure now.
func TestCancelledRequestIsNotLoggedAsFailure(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	arrived := make(chan struct{})
	hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-r.Context().Done() // never answered: the client gives up
	}, nil)
	go func() {
		<-arrived
		cancel()
	}()
	if _, err := hs.client.List(ctx, backstop.ListRequest{Resource: backstop.Contacts}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if logs := hs.logs.String(); strings.Contains(logs, "request failed") || strings.Contains(logs, `"level":"WARN"`) {
		t.Errorf("a cancelled request was logged as a failure:\n%s", logs)
	}
}

// A request that fails on its deadline is a failure, and is logged as one
// (only a cancelled run's is not).
func TestRequestPastItsDeadlineIsLoggedAsFailure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answered: the deadline passes
	}, nil)
	if _, err := hs.client.List(ctx, backstop.ListRequest{Resource: backstop.Contacts}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want context.DeadlineExceeded", err)
	}
	if logs := hs.logs.String(); !strings.Contains(logs, "request failed") {
		t.Errorf("a request past its deadline was not logged as a failure:\n%s", logs)
	}
}

// A request stopped while it waits for the governor (a run interrupted
// while its first request waited its turn) counts that wait: the summary
// showed 0s of throttle wait after seconds of it.
func TestWaitForTheGovernorCountsWhenStopped(t *testing.T) {
	gov := governor.New(testKey, governor.Options{Limit: 1, Window: time.Hour, Reserve: -1})
	hs := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"id":"ct_1","updated_at":"2025-03-01T10:00:00Z"}`)
	}, func(o *Options) { o.Governor = gov })
	if _, _, err := hs.client.Get(context.Background(), backstop.Contacts, "ct_1"); err != nil {
		t.Fatal(err) // the hour's one request
	}
	const wait = 150 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, cost, err := hs.client.Get(ctx, backstop.Contacts, "ct_1")
	if err == nil {
		t.Fatal("a request past the hour's budget was sent")
	}
	if cost.Requests != 0 || cost.ThrottleWait < wait-20*time.Millisecond {
		t.Errorf("cost of a request stopped while it waited for the governor: %+v, want no request and about %v throttled", cost, wait)
	}
}
