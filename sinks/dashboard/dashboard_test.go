package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sinks/delivery"
)

const testToken = "s3cret-dashboard-token"

// fakeBackend serves fixed data; RetryFunc decides retries.
type fakeBackend struct {
	mu        sync.Mutex
	rows      []delivery.Row
	retries   int
	RetryFunc func(seen delivery.Row) (bool, error)
	leader    JobsLeader
	revoked   map[string]bool
	// targets, when set, is what Targets returns instead of billing alone.
	targets []Target
	// counted records the counts argument of every Targets call.
	counted []bool
	// attempts are every delivery's attempts; readAll counts the calls
	// of Attempts, readLast holds the n of every LastAttempts call.
	attempts []delivery.Attempt
	readAll  int
	readLast []int
	// jobs is what Jobs returns.
	jobs []Job
}

func (f *fakeBackend) Deliveries(_ context.Context, flt DeliveryFilter) ([]delivery.Row, error) {
	// f.rows are newest first, as the store returns them.
	var rows []delivery.Row
	for _, r := range f.rows {
		if (flt.Before == 0 || r.ID < flt.Before) && (flt.After == 0 || r.ID > flt.After) {
			rows = append(rows, r)
		}
	}
	if flt.After > 0 {
		return rows[max(len(rows)-flt.Limit, 0):], nil
	}
	return rows[:min(flt.Limit, len(rows))], nil
}

func (f *fakeBackend) Delivery(_ context.Context, id int64) (delivery.Row, bool, error) {
	for _, r := range f.rows {
		if r.ID == id {
			return r, true, nil
		}
	}
	return delivery.Row{}, false, nil
}

func (f *fakeBackend) Attempts(context.Context, int64) ([]delivery.Attempt, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.readAll++
	return f.attempts, nil
}

func (f *fakeBackend) LastAttempts(_ context.Context, _ int64, n int) ([]delivery.Attempt, int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.readLast = append(f.readLast, n)
	return f.attempts[max(len(f.attempts)-n, 0):], len(f.attempts), nil
}

func (f *fakeBackend) Targets(_ context.Context, counts bool) ([]Target, error) {
	f.mu.Lock()
	f.counted = append(f.counted, counts)
	f.mu.Unlock()
	if f.targets != nil {
		return f.targets, nil
	}
	return []Target{{TargetState: delivery.TargetState{Name: "billing", DeadLetter: 1}, URL: "https://billing.example.com/hooks"}}, nil
}

func (f *fakeBackend) Retry(_ context.Context, seen delivery.Row) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.retries++
	if f.RetryFunc != nil {
		return f.RetryFunc(seen)
	}
	return true, nil
}

func (f *fakeBackend) RetryDead(context.Context, string, time.Time) (int64, error) { return 1, nil }

func (f *fakeBackend) Redirect(context.Context, delivery.Row, string) (delivery.Attempt, error) {
	return delivery.Attempt{StatusCode: 200}, nil
}

func (f *fakeBackend) Jobs(context.Context, int) ([]Job, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.jobs, nil
}

func (f *fakeBackend) RunJob(context.Context, string, func(), func(time.Duration)) error { return nil }

func (f *fakeBackend) ReconcileRuns(context.Context, int) ([]ReconcileRun, error) { return nil, nil }

func (f *fakeBackend) Cursors(context.Context) ([]backstop.Cursor, error) { return nil, nil }

func (f *fakeBackend) RevokeSession(_ context.Context, id string, _ time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.revoked == nil {
		f.revoked = map[string]bool{}
	}
	f.revoked[id] = true
	return nil
}

func (f *fakeBackend) SessionRevoked(_ context.Context, id string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.revoked[id], nil
}

func (f *fakeBackend) JobsLeader() JobsLeader {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.leader
}

func (f *fakeBackend) Quota(context.Context, time.Time) ([]KeyQuota, error) {
	return []KeyQuota{{KeyID: "0123456789abcdef", Live: true, Limit: 30, Remaining: 12}}, nil
}

func (f *fakeBackend) Intake(context.Context, time.Time, time.Duration) (IntakeStats, error) {
	return IntakeStats{}, nil
}

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time)     { c.mu.Lock(); defer c.mu.Unlock(); c.t = t }
func (c *clock) Add(d time.Duration) { c.Set(c.Now().Add(d)) }

// serve starts the dashboard over a fake backend with one dead letter.
func serve(t *testing.T) (*httptest.Server, *fakeBackend, *clock) {
	t.Helper()
	fb := &fakeBackend{rows: []delivery.Row{{ID: 7, Target: "billing", EventID: "evt_7", EventType: "payment.failed",
		Payload: json.RawMessage(`{"event_id":"evt_7"}`), Status: delivery.StatusDeadLetter, Attempts: 1,
		CreatedAt: t0.Add(-time.Hour), UpdatedAt: t0.Add(-30 * time.Minute), LastStatus: 400}}}
	clk := &clock{t: t0}
	d, err := New(Options{Token: testToken, Backend: fb, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d)
	t.Cleanup(func() {
		srv.Close()
		d.Close(context.Background())
	})
	return srv, fb, clk
}

// client is a browser-like client: a cookie jar, no redirects followed.
func client(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

type answer struct {
	status int
	header http.Header
	body   string
}

func do(t *testing.T, c *http.Client, method, rawURL string, form url.Values, header map[string]string) answer {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, rawURL, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return answer{res.StatusCode, res.Header, string(b)}
}

var html = map[string]string{"Accept": "text/html"}

// signIn signs c in and returns the CSRF token of its session.
func signIn(t *testing.T, c *http.Client, base string) string {
	t.Helper()
	a := do(t, c, "POST", base+"/ui/login", url.Values{"token": {testToken}, "next": {"/ui/deliveries"}}, html)
	if a.status != http.StatusSeeOther || a.header.Get("Location") != "/ui/deliveries" {
		t.Fatalf("sign-in: %d to %q, want 303 to /ui/deliveries", a.status, a.header.Get("Location"))
	}
	page := do(t, c, "GET", base+"/ui/deliveries", nil, html)
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(page.body)
	if page.status != http.StatusOK || m == nil {
		t.Fatalf("deliveries page after sign-in: %d, CSRF token found: %v", page.status, m != nil)
	}
	return m[1]
}

func TestSignIn(t *testing.T) {
	srv, _, clk := serve(t)
	c := client(t)

	a := do(t, c, "GET", srv.URL+"/ui/jobs?range=6h", nil, html)
	if a.status != http.StatusSeeOther || a.header.Get("Location") != "/ui/login?next=%2Fui%2Fjobs%3Frange%3D6h" {
		t.Errorf("a browser without a session: %d to %q, want 303 to the login page", a.status, a.header.Get("Location"))
	}
	a = do(t, c, "GET", srv.URL+"/ui/jobs", nil, nil)
	if a.status != http.StatusUnauthorized || !strings.Contains(a.body, `"code":"unauthorized"`) {
		t.Errorf("a script without a token: %d %s, want 401 JSON", a.status, a.body)
	}
	a = do(t, c, "POST", srv.URL+"/ui/login", url.Values{"token": {"wrong"}}, html)
	if a.status != http.StatusUnauthorized || !strings.Contains(a.body, "not the dashboard token") || len(c.Jar.Cookies(mustURL(t, srv.URL+"/ui/"))) != 0 {
		t.Errorf("a wrong token: %d, cookies %v; want 401, the form again and no session", a.status, c.Jar.Cookies(mustURL(t, srv.URL+"/ui/")))
	}

	a = do(t, c, "POST", srv.URL+"/ui/login", url.Values{"token": {testToken}, "next": {"/ui/jobs?range=6h"}}, html)
	if a.status != http.StatusSeeOther || a.header.Get("Location") != "/ui/jobs?range=6h" {
		t.Fatalf("sign-in: %d to %q, want 303 back to /ui/jobs?range=6h", a.status, a.header.Get("Location"))
	}
	cookie := a.header.Get("Set-Cookie")
	for _, want := range []string{SessionCookie + "=", "Path=/ui", "HttpOnly", "SameSite=Strict", "Max-Age=43200"} {
		if !strings.Contains(cookie, want) {
			t.Errorf("session cookie %q lacks %s", cookie, want)
		}
	}
	if a := do(t, c, "GET", srv.URL+"/ui/quota", nil, html); a.status != http.StatusOK || !strings.Contains(a.body, "0123456789abcdef") {
		t.Errorf("quota page with a session: %d", a.status)
	}
	if strings.Contains(do(t, c, "GET", srv.URL+"/ui/deliveries", nil, html).body, testToken) {
		t.Error("a page shows the dashboard token")
	}

	clk.Add(DefaultSessionTTL)
	if a := do(t, c, "GET", srv.URL+"/ui/quota", nil, html); a.status != http.StatusSeeOther {
		t.Errorf("after the session's end: %d, want 303 to the login page", a.status)
	}
}

func TestSessionCookieCannotBeForged(t *testing.T) {
	k := newKeys(testToken)
	s, err := newSession(t0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	v := k.cookieValue(s)
	if _, err := k.parseCookie(v, t0); err != nil {
		t.Fatalf("own cookie refused: %v", err)
	}
	payload, sig, _ := strings.Cut(v, ".")
	forged := []string{
		"", "x", payload, payload + ".", "." + sig,
		payload[:len(payload)-2] + "AA." + sig, // a later expiry, same signature
		newKeys("another-token").cookieValue(s),
		v + "A",
	}
	for _, f := range forged {
		if _, err := k.parseCookie(f, t0); err == nil {
			t.Errorf("forged cookie %q accepted", f)
		}
	}
	if _, err := k.parseCookie(v, t0.Add(time.Hour)); err == nil {
		t.Error("an expired session accepted")
	}
	if !k.tokenOK(testToken) || k.tokenOK(testToken+"x") || k.tokenOK("") {
		t.Error("tokenOK does not accept exactly the token")
	}
}

func TestPostsNeedTheSessionsCSRFToken(t *testing.T) {
	srv, fb, _ := serve(t)
	c := client(t)
	token := signIn(t, c, srv.URL)
	other := signIn(t, client(t), srv.URL)
	if token == other {
		t.Fatal("two sessions share a CSRF token")
	}
	retry := srv.URL + "/ui/deliveries/7/retry"
	seen := url.Values{"status": {"dead_letter"}, "version": {backstop.CanonicalTime(t0.Add(-30 * time.Minute))}}
	for name, tok := range map[string]string{"none": "", "another session's": other, "made up": "AAAA"} {
		form := url.Values{"status": seen["status"], "version": seen["version"]}
		if tok != "" {
			form.Set("csrf", tok)
		}
		a := do(t, c, "POST", retry, form, nil)
		var e struct {
			Error struct{ Code, Message string }
		}
		if a.status != http.StatusForbidden || json.Unmarshal([]byte(a.body), &e) != nil || e.Error.Code != "csrf" {
			t.Errorf("POST with %s CSRF token: %d %s, want 403 JSON with code csrf", name, a.status, a.body)
		}
		if a := do(t, c, "POST", retry, form, html); a.status != http.StatusForbidden || !strings.Contains(a.body, "CSRF token") {
			t.Errorf("POST from a page with %s CSRF token: %d, want 403 and a page saying why", name, a.status)
		}
	}
	if fb.retries != 0 {
		t.Fatalf("%d retries reached the backend without a valid CSRF token", fb.retries)
	}

	form := url.Values{"csrf": {token}, "status": seen["status"], "version": seen["version"]}
	cross := do(t, c, "POST", retry, form, map[string]string{"Sec-Fetch-Site": "cross-site", "Accept": "text/html"})
	if cross.status != http.StatusForbidden || fb.retries != 0 {
		t.Errorf("a cross-site POST with a valid CSRF token: %d, want 403", cross.status)
	}

	a := do(t, c, "POST", retry, form, html)
	if a.status != http.StatusSeeOther || a.header.Get("Location") != "/ui/deliveries/7" || fb.retries != 1 {
		t.Fatalf("POST with the CSRF token: %d to %q, %d retries; want 303 to the delivery and one retry", a.status, a.header.Get("Location"), fb.retries)
	}
	if page := do(t, c, "GET", srv.URL+"/ui/deliveries/7", nil, html); !strings.Contains(page.body, "queued again") {
		t.Error("the delivery page does not say the retry was queued")
	}
	if page := do(t, c, "GET", srv.URL+"/ui/deliveries/7", nil, html); strings.Contains(page.body, "queued again") {
		t.Error("the message is shown twice")
	}
}

// The retry acts on the delivery as the page showed it; when the backend
// finds it changed (a second submission), nothing is done and the answer
// says so.
func TestRetryPassesWhatThePageShowed(t *testing.T) {
	srv, fb, _ := serve(t)
	c := client(t)
	token := signIn(t, c, srv.URL)
	version := t0.Add(-30 * time.Minute)
	var got delivery.Row
	fb.RetryFunc = func(seen delivery.Row) (bool, error) {
		got = seen
		return false, nil
	}
	a := do(t, c, "POST", srv.URL+"/ui/deliveries/7/retry",
		url.Values{"csrf": {token}, "status": {"dead_letter"}, "version": {backstop.CanonicalTime(version)}}, nil)
	if a.status != http.StatusConflict || !strings.Contains(a.body, "nothing was done") || !strings.HasPrefix(a.body, `{"error":{"code":"conflict","message":`) {
		t.Errorf("retry of a changed delivery: %d %s, want 409 saying nothing was done, in the error body every error has", a.status, a.body)
	}
	if got.ID != 7 || got.Status != "dead_letter" || !got.UpdatedAt.Equal(version) {
		t.Errorf("backend asked to retry %+v, want delivery 7 as seen (dead_letter at %v)", got, version)
	}
	if a := do(t, c, "POST", srv.URL+"/ui/deliveries/7/retry", url.Values{"csrf": {token}, "version": {"yesterday"}}, nil); a.status != http.StatusBadRequest {
		t.Errorf("retry with an unreadable version: %d, want 400", a.status)
	}
	if a := do(t, c, "POST", srv.URL+"/ui/deliveries/8/retry", url.Values{"csrf": {token}}, nil); a.status != http.StatusNotFound {
		t.Errorf("retry of an unknown delivery: %d, want 404", a.status)
	}
	fb.RetryFunc = func(seen delivery.Row) (bool, error) {
		return false, fmt.Errorf("retry delivery %d: no such delivery: %w", seen.ID, backstop.ErrNotFound)
	}
	if a := do(t, c, "POST", srv.URL+"/ui/deliveries/7/retry", url.Values{"csrf": {token}}, nil); a.status != http.StatusNotFound {
		t.Errorf("retry of a delivery purged since the page was drawn: %d, want 404", a.status)
	}
}

func TestBearerToken(t *testing.T) {
	srv, fb, _ := serve(t)
	c := client(t)
	bearer := map[string]string{"Authorization": "Bearer " + testToken}
	if a := do(t, c, "GET", srv.URL+"/ui/deliveries", nil, bearer); a.status != http.StatusOK || !strings.Contains(a.body, "evt_7") {
		t.Errorf("GET with the bearer token: %d", a.status)
	}
	// A script needs no CSRF token: a browser never sends the header by
	// itself.
	a := do(t, c, "POST", srv.URL+"/ui/targets/billing/retry-dead", url.Values{}, bearer)
	if a.status != http.StatusOK || !strings.Contains(a.body, "1 dead letters of billing queued again") {
		t.Errorf("POST with the bearer token: %d %s", a.status, a.body)
	}
	wrong := map[string]string{"Authorization": "Bearer nope", "Accept": "text/html"}
	if a := do(t, c, "GET", srv.URL+"/ui/deliveries", nil, wrong); a.status != http.StatusUnauthorized {
		t.Errorf("GET with a wrong bearer token: %d, want 401 (not a login redirect)", a.status)
	}
	if a := do(t, c, "POST", srv.URL+"/ui/targets/nobody/retry-dead", url.Values{}, bearer); a.status != http.StatusNotFound {
		t.Errorf("retry-dead of an unknown target: %d, want 404", a.status)
	}
	if fb.retries != 0 {
		t.Error("retry-dead called Retry")
	}
}

func TestEveryPageRenders(t *testing.T) {
	srv, _, _ := serve(t)
	c := client(t)
	signIn(t, c, srv.URL)
	for _, path := range []string{"/ui/deliveries", "/ui/deliveries?status=dead_letter&target=billing&event=payment.failed&page=2",
		"/ui/dead-letters", "/ui/deliveries/7", "/ui/jobs", "/ui/quota", "/ui/quota?range=7d", "/ui/intake?range=6h"} {
		a := do(t, c, "GET", srv.URL+path, nil, html)
		if a.status != http.StatusOK {
			t.Errorf("GET %s: %d", path, a.status)
		}
		if csp := a.header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || a.header.Get("Cache-Control") != "no-store" {
			t.Errorf("GET %s: CSP %q, Cache-Control %q", path, csp, a.header.Get("Cache-Control"))
		}
	}
	if a := do(t, c, "GET", srv.URL+"/ui/deliveries?status=lost", nil, html); a.status != http.StatusBadRequest {
		t.Errorf("unknown status filter: %d, want 400", a.status)
	}
	// A page or action asked with the wrong method is 405 with Allow, not
	// 404 "no page"; a path that is none is still 404. (A DELETE, which no
	// route takes, passes the CSRF check as a GET does not need to.)
	for _, m := range []struct {
		method, path, allow string
		status              int
	}{
		{"GET", "/ui/deliveries/7/retry", "POST", http.StatusMethodNotAllowed},
		{"GET", "/ui/jobs/prune/run", "POST", http.StatusMethodNotAllowed},
		{"DELETE", "/ui/deliveries/5", "GET", http.StatusMethodNotAllowed},
		{"GET", "/ui/nothing-here", "", http.StatusNotFound},
	} {
		a := do(t, c, m.method, srv.URL+m.path, nil, map[string]string{"Authorization": "Bearer " + testToken})
		if a.status != m.status || a.header.Get("Allow") != m.allow {
			t.Errorf("%s %s: %d, Allow %q; want %d, Allow %q", m.method, m.path, a.status, a.header.Get("Allow"), m.status, m.allow)
		}
	}
	// A malformed event-type glob is the caller's mistake, not the store's:
	// it was answered 500 internal.
	for _, page := range []string{"/ui/deliveries?event=%5B", "/ui/dead-letters?event=payment.%5B"} {
		if a := do(t, c, "GET", srv.URL+page, nil, html); a.status != http.StatusBadRequest || !strings.Contains(a.body, "is not a glob") {
			t.Errorf("GET %s: %d %s, want 400 saying it is not a glob", page, a.status, a.body)
		}
	}
	for _, p := range []string{"0", "-1", "two", "9223372036854775807", "1000001"} {
		if a := do(t, c, "GET", srv.URL+"/ui/deliveries?page="+p, nil, html); a.status != http.StatusBadRequest || !strings.Contains(a.body, "not a page number") {
			t.Errorf("page %s: %d, want 400 saying it is not a page number", p, a.status)
		}
	}
	if a := do(t, c, "GET", srv.URL+"/ui/static/style.css", nil, nil); a.status != http.StatusOK || !strings.Contains(a.header.Get("Content-Type"), "text/css") {
		t.Errorf("stylesheet: %d %s", a.status, a.header.Get("Content-Type"))
	}
	// A file that is not there, and the directory, answer a JSON error as
	// the other errors do (plain text "404 page not found" before).
	for _, p := range []string{"/ui/static/nope.css", "/ui/static/"} {
		if a := do(t, c, "GET", srv.URL+p, nil, nil); a.status != http.StatusNotFound || !strings.Contains(a.body, `"not_found"`) {
			t.Errorf("GET %s: %d %s, want 404 with a JSON not_found error", p, a.status, a.body)
		}
	}
}

// Pages follow one another from the last row shown (Older) or the first
// (Newer), keeping the filter; deliveries queued while someone pages
// neither push a row already seen onto the next page nor hide one.
func TestDeliveriesArePaginated(t *testing.T) {
	fb := &fakeBackend{}
	for id := int64(5); id >= 1; id-- {
		fb.rows = append(fb.rows, delivery.Row{ID: id, Target: "billing", EventType: "payment.failed", Status: delivery.StatusDeadLetter,
			Payload: json.RawMessage(`{}`)})
	}
	d, err := New(Options{Token: testToken, Backend: fb, PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d)
	defer srv.Close()
	c := client(t)
	signIn(t, c, srv.URL)
	ids := regexp.MustCompile(`id="delivery-(\d+)"`)
	link := func(body, rel string) string {
		m := regexp.MustCompile(`<a href="([^"]+)" rel="` + rel + `"`).FindStringSubmatch(body)
		if m == nil {
			return ""
		}
		return strings.ReplaceAll(m[1], "&amp;", "&")
	}
	path, prev, next := "/ui/deliveries?status=dead_letter", "", ""
	for i, p := range []struct {
		follow, ids, page string
		prev, next        bool
	}{
		{"", "5 4", "Page 1", false, true},
		{"next", "3 2", "Page 2", true, true},
		{"next", "1", "Page 3", true, false},
		{"prev", "3 2", "Page 2", true, true},
		{"prev", "5 4", "Page 2", true, true},
		{"prev", "7 6", "Page 1", false, true},
	} {
		switch p.follow {
		case "next":
			path = next
		case "prev":
			path = prev
		}
		if i == 1 {
			// Two deliveries queued after the first page was drawn.
			for _, id := range []int64{6, 7} {
				fb.rows = append([]delivery.Row{{ID: id, Target: "billing", EventType: "payment.failed",
					Status: delivery.StatusDeadLetter, Payload: json.RawMessage(`{}`)}}, fb.rows...)
			}
		}
		a := do(t, c, "GET", srv.URL+path, nil, html)
		var got []string
		for _, m := range ids.FindAllStringSubmatch(a.body, -1) {
			got = append(got, m[1])
		}
		if strings.Join(got, " ") != p.ids {
			t.Errorf("step %d, %s lists deliveries %v, want %s", i, path, got, p.ids)
		}
		if !strings.Contains(a.body, p.page) {
			t.Errorf("step %d, %s is not %s", i, path, p.page)
		}
		prev, next = link(a.body, "prev"), link(a.body, "next")
		if (prev != "") != p.prev || (next != "") != p.next {
			t.Errorf("step %d, %s: newer link %q, older link %q; want %v, %v", i, path, prev, next, p.prev, p.next)
		}
		for _, l := range []string{prev, next} {
			if l != "" && !strings.Contains(l, "status=dead_letter") {
				t.Errorf("step %d, %s: the page link %s loses the filter", i, path, l)
			}
		}
	}
	// Newer from the second page once the two new ones are there: the
	// first page again, newest first and full.
	a := do(t, c, "GET", srv.URL+"/ui/deliveries?status=dead_letter&after=3&page=2", nil, html)
	var got []string
	for _, m := range ids.FindAllStringSubmatch(a.body, -1) {
		got = append(got, m[1])
	}
	if strings.Join(got, " ") != "5 4" || !strings.Contains(a.body, `rel="prev"`) {
		t.Errorf("the page newer than delivery 3 lists %v (newer link: %v), want 5 4 and a link to 7 6", got, strings.Contains(a.body, `rel="prev"`))
	}
	for _, bad := range []string{"before=x", "before=0", "after=-1", "before=2&after=1"} {
		if a := do(t, c, "GET", srv.URL+"/ui/deliveries?"+bad, nil, html); a.status != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", bad, a.status)
		}
	}
}

func TestNoTokenNoDashboard(t *testing.T) {
	if _, err := New(Options{Backend: &fakeBackend{}}); err == nil {
		t.Error("New without a token returned a dashboard")
	}
}

func TestSafeNext(t *testing.T) {
	for next, want := range map[string]string{
		"/ui/jobs?range=6h":    "/ui/jobs?range=6h",
		"/ui/deliveries/7":     "/ui/deliveries/7",
		"":                     "/ui/deliveries",
		"//evil.example/ui/x":  "/ui/deliveries",
		"https://evil.example": "/ui/deliveries",
		"/\\evil.example":      "/ui/deliveries",
		"/metrics":             "/ui/deliveries",
		"/ui/login":            "/ui/deliveries",
		"javascript:alert(1)":  "/ui/deliveries",
	} {
		if got := safeNext(next); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", next, got, want)
		}
	}
}

func TestBarChart(t *testing.T) {
	periods := []time.Time{t0, t0.Add(time.Hour), t0.Add(2 * time.Hour)}
	c := barChart(periods, time.Hour, "requests", []series{
		{Name: "ok", Class: "s-ok", Values: []float64{40, 0, 10}},
		{Name: "429", Class: "s-bad", Values: []float64{5, 0, 0}},
	})
	if c.Empty || len(c.Bars) != 3 {
		t.Fatalf("chart has %d bars (empty %v), want 3: two stacked, one alone, none for zero", len(c.Bars), c.Empty)
	}
	// 45 at the top of a 0..50 axis in steps of 10.
	if top := c.YTicks[len(c.YTicks)-1]; top.Label != "50" || len(c.YTicks) != 6 {
		t.Errorf("y axis %+v, want 0..50 in 6 ticks", c.YTicks)
	}
	plot := c.Base - c.Top
	stack := c.Bars[0].H + c.Bars[1].H
	if want := 45.0 / 50 * plot; stack < want-0.1 || stack > want+0.1 {
		t.Errorf("first stack is %.2f high, want %.2f", stack, want)
	}
	if c.Bars[1].Y+c.Bars[1].H != c.Bars[0].Y {
		t.Errorf("the 429s bar does not sit on the ok bar: %+v", c.Bars[:2])
	}
	if !strings.Contains(c.Bars[1].Title, "5 429") {
		t.Errorf("bar title %q", c.Bars[1].Title)
	}
	if e := barChart(periods, time.Hour, "events", nil); !e.Empty || len(e.Bars) != 0 {
		t.Errorf("chart of nothing: %+v", e)
	}
	for v, want := range map[float64]float64{0: 1, 0.3: 0.5, 1: 1, 3: 5, 11: 20, 24: 25, 101: 200} {
		if got := niceCeil(v); got != want {
			t.Errorf("niceCeil(%v) = %v, want %v", v, got, want)
		}
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestWrongTokensAreLimitedPerAddress(t *testing.T) {
	srv, _, clk := serve(t)
	c := client(t)
	for i := range maxFailures {
		if a := do(t, c, "POST", srv.URL+"/ui/login", url.Values{"token": {fmt.Sprint("guess", i)}}, html); a.status != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d, want 401", i+1, a.status)
		}
	}
	// Past the limit even the right token, and a bearer header, wait.
	a := do(t, c, "POST", srv.URL+"/ui/login", url.Values{"token": {testToken}}, html)
	if a.status != http.StatusTooManyRequests || a.header.Get("Retry-After") != "60" || !strings.Contains(a.body, "Too many wrong tokens") {
		t.Fatalf("after %d wrong tokens: %d Retry-After %q, want 429 with Retry-After 60", maxFailures, a.status, a.header.Get("Retry-After"))
	}
	req, _ := http.NewRequest("GET", srv.URL+"/ui/jobs", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusTooManyRequests {
		t.Errorf("bearer from a blocked address: %d, want 429", res.StatusCode)
	}

	clk.Add(failureWindow)
	if a := do(t, c, "POST", srv.URL+"/ui/login", url.Values{"token": {testToken}}, html); a.status != http.StatusSeeOther {
		t.Errorf("sign-in after the window: %d, want 303", a.status)
	}
}

// Wrong tokens from an address do not lock out a browser already signed
// in from it (a shared proxy, a NAT): its session cookie is no guess.
func TestWrongTokensDoNotLockOutASession(t *testing.T) {
	srv, _, _ := serve(t)
	operator := client(t)
	signIn(t, operator, srv.URL)
	stranger := client(t)
	for i := range maxFailures + 1 {
		do(t, stranger, "POST", srv.URL+"/ui/login", url.Values{"token": {fmt.Sprint("guess", i)}}, html)
	}
	if a := do(t, stranger, "GET", srv.URL+"/ui/jobs", nil, map[string]string{"Authorization": "Bearer " + testToken}); a.status != http.StatusTooManyRequests {
		t.Fatalf("bearer from the blocked address: %d, want 429", a.status)
	}
	if a := do(t, operator, "GET", srv.URL+"/ui/jobs", nil, html); a.status != http.StatusOK {
		t.Errorf("signed-in browser at the same address: %d, want 200", a.status)
	}
}

func TestWrongBearerTokensCount(t *testing.T) {
	srv, _, _ := serve(t)
	c := client(t)
	status := func(tok string) int {
		req, _ := http.NewRequest("GET", srv.URL+"/ui/jobs", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	for i := range maxFailures {
		if got := status(fmt.Sprint("guess", i)); got != http.StatusUnauthorized {
			t.Fatalf("wrong bearer %d: %d, want 401", i+1, got)
		}
	}
	if got := status("guess-again"); got != http.StatusTooManyRequests {
		t.Errorf("after %d wrong bearer tokens: %d, want 429", maxFailures, got)
	}
}

// A host holds a whole IPv6 /64 and could sign in from a fresh address of
// it for every guess: wrong tokens from one /64 count together, and another
// /64 is not held back by them.
func TestWrongTokensFromOneIPv6Slash64CountTogether(t *testing.T) {
	fb := &fakeBackend{}
	d, err := New(Options{Token: testToken, Backend: fb, Now: (&clock{t: t0}).Now})
	if err != nil {
		t.Fatal(err)
	}
	// The peer's address comes from the test, as a server reached over
	// IPv6 would see it.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.RemoteAddr = r.Header.Get("X-Test-Peer")
		d.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		srv.Close()
		d.Close(context.Background())
	})
	login := func(peer, token string) int {
		return do(t, client(t), "POST", srv.URL+"/ui/login", url.Values{"token": {token}},
			map[string]string{"Accept": "text/html", "X-Test-Peer": peer}).status
	}
	for i := range maxFailures {
		peer := fmt.Sprintf("[2001:db8:7:7::%x]:4%03d", i+1, i)
		if got := login(peer, fmt.Sprint("guess", i)); got != http.StatusUnauthorized {
			t.Fatalf("wrong token %d from %s: %d, want 401", i+1, peer, got)
		}
	}
	if got := login("[2001:db8:7:7:abcd::1]:5000", testToken); got != http.StatusTooManyRequests {
		t.Errorf("a new address of the same /64 after %d wrong tokens: %d, want 429", maxFailures, got)
	}
	if got := login("[2001:db8:7:8::1]:5000", testToken); got != http.StatusSeeOther {
		t.Errorf("an address of another /64: %d, want 303 (signed in)", got)
	}
}

// Behind a proxy that ends TLS (X-Forwarded-Proto: https) the session
// cookie is Secure; over plain HTTP it cannot be, or the browser would drop it.
func TestSessionCookieSecureBehindATLSProxy(t *testing.T) {
	srv, _, _ := serve(t)
	for _, tc := range []struct {
		proto  string
		secure bool
	}{{"", false}, {"https", true}, {"HTTPS", true}, {"http", false}} {
		hdr := map[string]string{"Accept": "text/html"}
		if tc.proto != "" {
			hdr["X-Forwarded-Proto"] = tc.proto
		}
		a := do(t, client(t), "POST", srv.URL+"/ui/login", url.Values{"token": {testToken}}, hdr)
		cookie := a.header.Get("Set-Cookie")
		if a.status != http.StatusSeeOther || strings.Contains(cookie, "Secure") != tc.secure {
			t.Errorf("X-Forwarded-Proto %q: %d, cookie %q; want Secure = %v", tc.proto, a.status, cookie, tc.secure)
		}
	}
}

// The Jobs page says which process runs the scheduled jobs when several
// serve processes elect one, and says nothing without an election.
func TestJobsPageSaysWhereJobsRun(t *testing.T) {
	srv, fb, _ := serve(t)
	bearer := map[string]string{"Authorization": "Bearer " + testToken, "Accept": "text/html"}
	for _, tc := range []struct {
		leader JobsLeader
		want   string
	}{
		{JobsLeader{}, ""},
		{JobsLeader{Elected: true, Leader: true}, "This process holds the jobs lease"},
		{JobsLeader{Elected: true}, "Another serve process holds the jobs lease"},
	} {
		fb.mu.Lock()
		fb.leader = tc.leader
		fb.mu.Unlock()
		a := do(t, client(t), "GET", srv.URL+"/ui/jobs", nil, bearer)
		if a.status != http.StatusOK {
			t.Fatalf("jobs page: %d", a.status)
		}
		has := strings.Contains(a.body, `id="jobs-leader"`)
		if tc.want == "" && has || tc.want != "" && !strings.Contains(a.body, tc.want) {
			t.Errorf("leader %+v: page does not say %q (leader line shown: %v)", tc.leader, tc.want, has)
		}
	}
}

// Signing out ends the session for every copy of its cookie, not only the
// browser's own (the cookie is signed, not stored: its id is revoked).
func TestSignOutRevokesCopiedCookies(t *testing.T) {
	srv, _, _ := serve(t)
	c := client(t)
	csrf := signIn(t, c, srv.URL)
	var stolen *http.Cookie
	for _, ck := range c.Jar.Cookies(mustURL(t, srv.URL+"/ui/")) {
		if ck.Name == SessionCookie {
			stolen = ck
		}
	}
	if stolen == nil {
		t.Fatal("no session cookie after sign-in")
	}
	copied := client(t)
	copied.Jar.SetCookies(mustURL(t, srv.URL+"/ui/"), []*http.Cookie{stolen})
	if a := do(t, copied, "GET", srv.URL+"/ui/jobs", nil, html); a.status != http.StatusOK {
		t.Fatalf("the copied cookie before sign-out: %d, want 200", a.status)
	}
	if a := do(t, c, "POST", srv.URL+"/ui/logout", url.Values{"csrf": {csrf}}, html); a.status != http.StatusSeeOther || a.header.Get("Location") != "/ui/login" {
		t.Fatalf("sign-out: %d to %q, want 303 to the login page", a.status, a.header.Get("Location"))
	}
	if a := do(t, copied, "GET", srv.URL+"/ui/jobs", nil, html); a.status != http.StatusSeeOther || !strings.HasPrefix(a.header.Get("Location"), "/ui/login") {
		t.Errorf("the copied cookie after sign-out: %d to %q, want 303 to the login page", a.status, a.header.Get("Location"))
	}
}

// A target removed from the configuration that still has deliveries is
// listed, marked as such, in the Targets table and the target filter; its
// dead letters and its deliveries cannot be retried (they would never be
// sent).
func TestUnconfiguredTargetIsListedButNotRetried(t *testing.T) {
	srv, fb, _ := serve(t)
	fb.rows = append(fb.rows, delivery.Row{ID: 13, Target: "a1", EventID: "evt_13", EventType: "payment.failed",
		Payload: json.RawMessage(`{}`), Status: delivery.StatusDeadLetter, CreatedAt: t0.Add(-time.Hour), UpdatedAt: t0.Add(-time.Hour)})
	fb.targets = []Target{
		{TargetState: delivery.TargetState{Name: "billing", DeadLetter: 1}, URL: "https://billing.example.com/hooks"},
		{TargetState: delivery.TargetState{Name: "a1", Pending: 2, DeadLetter: 1}, Unconfigured: true},
	}
	c := client(t)
	token := signIn(t, c, srv.URL)
	a := do(t, c, "GET", srv.URL+"/ui/dead-letters", nil, html)
	row := regexp.MustCompile(`(?s)<tr id="target-a1">.*?</tr>`).FindString(a.body)
	if !strings.Contains(row, "not in the configuration") {
		t.Errorf("the Targets table does not mark a1 as not in the configuration:\n%s", row)
	}
	if strings.Contains(row, "retry-dead") {
		t.Errorf("the Targets table offers to retry the dead letters of a1, which would never be sent:\n%s", row)
	}
	if !strings.Contains(a.body, `<option value="a1">a1 (not in the configuration)</option>`) {
		t.Errorf("the target filter does not offer a1")
	}
	if a := do(t, c, "POST", srv.URL+"/ui/targets/a1/retry-dead", url.Values{"csrf": {token}}, nil); a.status != http.StatusNotFound {
		t.Errorf("retry-dead of a1: %d %s, want 404", a.status, a.body)
	}
	a = do(t, c, "POST", srv.URL+"/ui/deliveries/13/retry", url.Values{"csrf": {token}}, nil)
	if a.status != http.StatusConflict || !strings.Contains(a.body, "not in the configuration") {
		t.Errorf("retry of a delivery of a1: %d %s, want 409 saying a1 is not in the configuration", a.status, a.body)
	}
	if fb.retries != 0 {
		t.Errorf("the backend was asked to retry %d times, want none", fb.retries)
	}
}

// A page number past the end of the delivery list says so and links to
// the first page (not "No delivery matches.", with no way back).
func TestDeliveriesPagePastTheEnd(t *testing.T) {
	srv, fb, _ := serve(t)
	c := client(t)
	signIn(t, c, srv.URL)
	a := do(t, c, "GET", srv.URL+"/ui/deliveries?status=dead_letter&before=7&page=9999", nil, html)
	if a.status != http.StatusOK || !strings.Contains(a.body, "Page 9999 is past the end of this list.") {
		t.Errorf("page 9999: %d, does not say it is past the end:\n%s", a.status, a.body)
	}
	link := regexp.MustCompile(`<a href="([^"]+)" id="first-page">`).FindStringSubmatch(a.body)
	if link == nil || strings.Contains(link[1], "before=") || !strings.Contains(link[1], "status=dead_letter") {
		t.Errorf("page 9999 has no link to the first page of the same list: %v", link)
	}
	if strings.Contains(a.body, "No delivery matches.") || strings.Contains(a.body, `rel="prev"`) {
		t.Errorf("page 9999 says no delivery matches, or links to page 9998")
	}
	fb.rows = nil
	if a := do(t, c, "GET", srv.URL+"/ui/deliveries", nil, html); !strings.Contains(a.body, "No delivery matches.") {
		t.Errorf("an empty first page does not say that no delivery matches")
	}
}

// A range the quota and intake pages do not offer is refused with 400, as
// an unknown status filter is, rather than answered with another range.
func TestUnknownRangeIsRefused(t *testing.T) {
	srv, _, _ := serve(t)
	c := client(t)
	signIn(t, c, srv.URL)
	for _, path := range []string{"/ui/quota?range=1y", "/ui/intake?range=1y", "/ui/quota?range=24H"} {
		a := do(t, c, "GET", srv.URL+path, nil, html)
		if a.status != http.StatusBadRequest || !strings.Contains(a.body, "is not one of 6h, 24h, 7d") {
			t.Errorf("GET %s: %d, want 400 naming the ranges offered", path, a.status)
		}
	}
	for _, path := range []string{"/ui/quota", "/ui/quota?range=6h", "/ui/intake?range=7d"} {
		if a := do(t, c, "GET", srv.URL+path, nil, html); a.status != http.StatusOK {
			t.Errorf("GET %s: %d, want 200", path, a.status)
		}
	}
}

// Behind a proxy that asks for HTTP Basic credentials, the browser sends
// them with every request: they are not a wrong dashboard token. The
// operator signs in and uses the dashboard with a session as anywhere
// else (its POSTs still need the CSRF token), and the proxy's credentials
// never count toward the limit on wrong tokens.
func TestBasicCredentialsOfAProxyInFrontAreNotAWrongToken(t *testing.T) {
	srv, fb, _ := serve(t)
	c := client(t)
	basic := map[string]string{"Accept": "text/html", "Authorization": "Basic b3BlcmF0b3I6cHJveHktcGFzc3dvcmQ="}
	for i := range maxFailures + 1 {
		if a := do(t, c, "GET", srv.URL+"/ui/login", nil, basic); a.status != http.StatusOK {
			t.Fatalf("login page %d with the proxy's credentials: %d, want 200", i+1, a.status)
		}
	}
	a := do(t, c, "POST", srv.URL+"/ui/login", url.Values{"token": {testToken}, "next": {"/ui/deliveries"}}, basic)
	if a.status != http.StatusSeeOther || a.header.Get("Location") != "/ui/deliveries" {
		t.Fatalf("sign-in with the proxy's credentials: %d to %q, want 303 to /ui/deliveries", a.status, a.header.Get("Location"))
	}
	page := do(t, c, "GET", srv.URL+"/ui/deliveries", nil, basic)
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(page.body)
	if page.status != http.StatusOK || m == nil {
		t.Fatalf("deliveries page with the proxy's credentials: %d, CSRF token found: %v", page.status, m != nil)
	}
	retry := srv.URL + "/ui/deliveries/7/retry"
	form := url.Values{"status": {"dead_letter"}, "version": {backstop.CanonicalTime(t0.Add(-30 * time.Minute))}}
	if a := do(t, c, "POST", retry, form, basic); a.status != http.StatusForbidden {
		t.Errorf("POST without the CSRF token: %d, want 403", a.status)
	}
	form.Set("csrf", m[1])
	if a := do(t, c, "POST", retry, form, basic); a.status != http.StatusSeeOther || fb.retries != 1 {
		t.Errorf("POST with the CSRF token: %d, %d retries; want 303 and one retry", a.status, fb.retries)
	}
}

// Only the Dead letters view shows the targets' counts, so only it asks
// for them (counting reads every row of the outbox): the log, a
// delivery's page, Retry and Redirect ask for the targets without.
func TestOnlyTheDeadLettersViewCountsDeliveries(t *testing.T) {
	srv, fb, _ := serve(t)
	h := map[string]string{"Authorization": "Bearer " + testToken, "Accept": "text/html"}
	for _, c := range []struct {
		method, path string
		form         url.Values
		counts       bool
	}{
		{"GET", "/ui/deliveries", nil, false},
		{"GET", "/ui/deliveries?status=dead_letter", nil, false},
		{"GET", "/ui/deliveries/7", nil, false},
		{"POST", "/ui/deliveries/7/retry", url.Values{}, false},
		{"POST", "/ui/deliveries/7/redirect", url.Values{"url": {"https://inspector.example.com/in"}}, false},
		{"POST", "/ui/targets/billing/retry-dead", url.Values{}, false},
		{"GET", "/ui/dead-letters", nil, true},
	} {
		fb.mu.Lock()
		fb.counted = nil
		fb.mu.Unlock()
		a := do(t, client(t), c.method, srv.URL+c.path, c.form, h)
		if a.status >= 400 {
			t.Errorf("%s %s: %d %.300s", c.method, c.path, a.status, a.body)
		}
		fb.mu.Lock()
		counted := fb.counted
		fb.mu.Unlock()
		if len(counted) == 0 {
			t.Errorf("%s %s did not ask for the targets", c.method, c.path)
		}
		for _, got := range counted {
			if got != c.counts {
				t.Errorf("%s %s asked for the targets with counts %v, want %v", c.method, c.path, got, c.counts)
			}
		}
	}
	page := do(t, client(t), "GET", srv.URL+"/ui/dead-letters", nil, h)
	if !strings.Contains(page.body, `<td class="num dead-count">1</td>`) {
		t.Errorf("the Dead letters page lacks billing's count of dead letters:\n%.2000s", page.body)
	}
}

// A row of the log lists the last 10 attempts of its delivery and says how
// many there are: it asks the backend for those 10 and the total only, not
// for every attempt (2,000 of 4 KiB each made 8 MB for one row); the
// delivery's own page reads and lists them all.
func TestLogRowsReadOnlyTheirLastAttempts(t *testing.T) {
	srv, fb, _ := serve(t)
	for i := 1; i <= 25; i++ {
		fb.attempts = append(fb.attempts, delivery.Attempt{ID: int64(i), DeliveryID: 7, Target: "billing",
			URL: "https://billing.example.com/hooks", Attempt: i, StatusCode: 429, RequestID: fmt.Sprintf("req-%d", i),
			At: t0.Add(time.Duration(i) * time.Second)})
	}
	h := map[string]string{"Authorization": "Bearer " + testToken, "Accept": "text/html"}
	shown := regexp.MustCompile(`<tbody class="attempt" data-attempt="(\d+)">`)
	numbers := func(body string) []string {
		var out []string
		for _, m := range shown.FindAllStringSubmatch(body, -1) {
			out = append(out, m[1])
		}
		return out
	}
	a := do(t, client(t), "GET", srv.URL+"/ui/deliveries", nil, h)
	fb.mu.Lock()
	readAll, readLast := fb.readAll, fb.readLast
	fb.mu.Unlock()
	if readAll != 0 || !reflect.DeepEqual(readLast, []int{10}) {
		t.Errorf("the log read every attempt %d times and the last n of them for %v; want the last 10, once", readAll, readLast)
	}
	if got := numbers(a.body); strings.Join(got, " ") != "16 17 18 19 20 21 22 23 24 25" {
		t.Errorf("the log's row lists attempts %v, want 16 to 25", got)
	}
	if !strings.Contains(a.body, "The last 10 of 25 attempts") {
		t.Errorf("the log's row does not say it lists the last 10 of 25 attempts")
	}
	a = do(t, client(t), "GET", srv.URL+"/ui/deliveries/7", nil, h)
	if got := numbers(a.body); len(got) != 25 || strings.Contains(a.body, "The last 10") {
		t.Errorf("the delivery's page lists %d attempts, want all 25 and no note", len(got))
	}
}

// The jobs page shows the file a backup job's run wrote beside its result.
func TestJobsPageShowsBackupFile(t *testing.T) {
	srv, fb, _ := serve(t)
	const file = "/var/backups/backstop/nightly-backup-20261201T041500Z.db"
	fb.mu.Lock()
	fb.jobs = []Job{{Name: "nightly-backup", Kind: "backup", Schedule: "cron 15 4 * * *", NextRun: t0.Add(time.Hour),
		Runs: []JobRun{{StartedAt: t0.Add(-time.Hour), FinishedAt: t0.Add(-time.Hour + time.Second), Status: "ok",
			Counts: backstop.JobCounts{Pruned: 1}, Output: file}}}}
	fb.mu.Unlock()
	c := client(t)
	signIn(t, c, srv.URL)
	a := do(t, c, "GET", srv.URL+"/ui/jobs", nil, html)
	if a.status != http.StatusOK || !strings.Contains(a.body, file) {
		t.Fatalf("jobs page: %d, want the backup file %s on it:\n%s", a.status, file, a.body)
	}
}
