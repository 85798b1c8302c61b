package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
)

type listBody struct {
	Data []json.RawMessage `json:"data"`
	Meta struct {
		NextCursor string `json:"next_cursor"`
		HasMore    bool   `json:"has_more"`
	} `json:"meta"`
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// do sends GET path?q with the given key ("" sends no Authorization).
func do(t testing.TB, base, key, path string, q url.Values) (*http.Response, []byte) {
	t.Helper()
	u := base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

func listQuery(cursor string, limit int, since string) url.Values {
	q := url.Values{}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	if limit != 0 {
		q.Set("cursor_limit", strconv.Itoa(limit))
	}
	if since != "" {
		q.Set("since", since)
	}
	return q
}

// list fetches one page and fails the test unless it is a 200.
func list(t testing.TB, base, key string, r backstop.Resource, cursor string, limit int, since string) listBody {
	t.Helper()
	resp, body := do(t, base, key, "/public/v1/"+string(r), listQuery(cursor, limit, since))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("list %s: status %d: %s", r, resp.StatusCode, body)
	}
	var b listBody
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatalf("list %s: %v", r, err)
	}
	return b
}

// walk pages through r from cursor until has_more is false. It returns the
// objects, the size of each page and the final cursor.
func walk(t testing.TB, base, key string, r backstop.Resource, cursor string, limit int, since string) ([]backstop.Object, []int, string) {
	t.Helper()
	var objs []backstop.Object
	var sizes []int
	for range 1_000_000 {
		b := list(t, base, key, r, cursor, limit, since)
		if b.Meta.NextCursor == "" {
			t.Fatalf("list %s: empty next_cursor", r)
		}
		for _, d := range b.Data {
			o, err := backstop.DecodeObject(r, d)
			if err != nil {
				t.Fatal(err)
			}
			objs = append(objs, o)
		}
		sizes = append(sizes, len(b.Data))
		cursor = b.Meta.NextCursor
		if !b.Meta.HasMore {
			return objs, sizes, cursor
		}
		if len(b.Data) == 0 {
			t.Fatalf("list %s: empty page with has_more", r)
		}
	}
	t.Fatal("walk did not end")
	return nil, nil, ""
}

func newServer(t testing.TB, opts Options) (*Sim, *httptest.Server) {
	t.Helper()
	s := New(opts)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return s, srv
}

func sameObjects(t *testing.T, got, want []backstop.Object) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d objects, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].ID != want[i].ID || !got[i].UpdatedAt.Equal(want[i].UpdatedAt) || !bytes.Equal(got[i].Data, want[i].Data) {
			t.Fatalf("object %d: got %s@%s, want %s@%s", i, got[i].ID, got[i].UpdatedAt, want[i].ID, want[i].UpdatedAt)
		}
	}
}

func TestPaginationWalksEveryObjectOnce(t *testing.T) {
	s, srv := newServer(t, Options{Seed: 1, Objects: 500})
	for _, r := range backstop.Resources {
		want := s.Objects(r)
		if len(want) != 500 {
			t.Fatalf("%s: %d objects, want 500", r, len(want))
		}
		for i := 1; i < len(want); i++ {
			if want[i-1].Position().Compare(want[i].Position()) >= 0 {
				t.Fatalf("%s: Objects not in feed order at %d", r, i)
			}
		}
		for _, size := range []int{1, 7, 200} {
			t.Run(fmt.Sprintf("%s/%d", r, size), func(t *testing.T) {
				got, sizes, _ := walk(t, srv.URL, s.APIKey(), r, "", size, "")
				sameObjects(t, got, want)
				// Every page but the last is full, and some page boundary
				// splits a run of equal updated_at.
				split := false
				n := 0
				for i, sz := range sizes[:len(sizes)-1] {
					if sz != size {
						t.Fatalf("page %d has %d objects, want %d", i, sz, size)
					}
					n += sz
					if want[n-1].UpdatedAt.Equal(want[n].UpdatedAt) {
						split = true
					}
				}
				if size < 200 && !split {
					t.Errorf("no page boundary splits a run of equal updated_at")
				}
			})
		}
	}
}

func TestDefaultPageSize(t *testing.T) {
	s, srv := newServer(t, Options{Seed: 2, Objects: 50})
	b := list(t, srv.URL, s.APIKey(), backstop.Chats, "", 0, "")
	if len(b.Data) != DefaultPageSize || !b.Meta.HasMore {
		t.Fatalf("got %d objects, has_more %v; want %d, true", len(b.Data), b.Meta.HasMore, DefaultPageSize)
	}
}

func TestSince(t *testing.T) {
	s, srv := newServer(t, Options{Seed: 3, Objects: 300})
	all := s.Objects(backstop.Messages)
	// A since equal to the updated_at of an object inside a run of equal
	// timestamps must include the whole run.
	k := -1
	for i := 100; i < len(all); i++ {
		if all[i].UpdatedAt.Equal(all[i-1].UpdatedAt) {
			k = i - 1
			for k > 0 && all[k-1].UpdatedAt.Equal(all[k].UpdatedAt) {
				k--
			}
			break
		}
	}
	if k < 0 {
		t.Fatal("no run of equal updated_at")
	}
	since := all[k].UpdatedAt.Format(time.RFC3339Nano)
	got, _, _ := walk(t, srv.URL, s.APIKey(), backstop.Messages, "", 7, since)
	sameObjects(t, got, all[k:])

	// The same instant in another zone and form selects the same objects.
	alt := all[k].UpdatedAt.In(time.FixedZone("", 3*3600)).Format("2006-01-02T15:04:05.000000000-07:00")
	got, _, _ = walk(t, srv.URL, s.APIKey(), backstop.Messages, "", 200, alt)
	sameObjects(t, got, all[k:])

	// since after everything: an empty page whose cursor, saved, returns
	// later changes only.
	b := list(t, srv.URL, s.APIKey(), backstop.Messages, "", 10, "2027-06-01T00:00:00Z")
	if len(b.Data) != 0 || b.Meta.HasMore || b.Meta.NextCursor == "" {
		t.Fatalf("since in the future: %+v", b)
	}
	// A cursor combined with since starts at the later of the two.
	b = list(t, srv.URL, s.APIKey(), backstop.Messages, "", 5, "")
	got, _, _ = walk(t, srv.URL, s.APIKey(), backstop.Messages, b.Meta.NextCursor, 50, all[1].UpdatedAt.Format(time.RFC3339Nano))
	sameObjects(t, got, all[5:])
}

func TestBadRequests(t *testing.T) {
	s, srv := newServer(t, Options{Seed: 4, Objects: 30})
	key := s.APIKey()
	contactsCursor := list(t, srv.URL, key, backstop.Contacts, "", 3, "").Meta.NextCursor
	for _, tc := range []struct {
		name   string
		path   string
		q      url.Values
		status int
		code   string
	}{
		{"garbage cursor", "/public/v1/chats", listQuery("not a cursor!", 0, ""), 400, "invalid_cursor"},
		{"base64 garbage cursor", "/public/v1/chats", listQuery("AAAA", 0, ""), 400, "invalid_cursor"},
		{"other resource's cursor", "/public/v1/chats", listQuery(contactsCursor, 0, ""), 400, "invalid_cursor"},
		{"limit 0", "/public/v1/chats", url.Values{"cursor_limit": {"0"}}, 400, "invalid_limit"},
		{"limit 201", "/public/v1/chats", url.Values{"cursor_limit": {"201"}}, 400, "invalid_limit"},
		{"limit text", "/public/v1/chats", url.Values{"cursor_limit": {"ten"}}, 400, "invalid_limit"},
		{"bad since", "/public/v1/chats", url.Values{"since": {"yesterday"}}, 400, "invalid_since"},
		{"unknown resource", "/public/v1/invoices", nil, 404, "not_found"},
		{"unknown path", "/v2/contacts", nil, 404, "not_found"},
		{"unknown id", "/public/v1/contacts/ct_nope", nil, 404, "not_found"},
		{"nested path", "/public/v1/contacts/a/b", nil, 404, "not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, srv.URL, key, tc.path, tc.q)
			checkError(t, resp, body, tc.status, tc.code)
			if resp.Header.Get("X-RateLimit-Limit") == "" {
				t.Error("no X-RateLimit-Limit on an authorised request")
			}
		})
	}

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/public/v1/contacts", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	checkError(t, resp, body, http.StatusMethodNotAllowed, "method_not_allowed")
}

func checkError(t *testing.T, resp *http.Response, body []byte, status int, code string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var e errorBody
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body %s: %v", body, err)
	}
	if e.Error.Code != code || e.Error.Message == "" {
		t.Fatalf("error %+v, want code %q and a message", e.Error, code)
	}
}

func TestInvalidateCursors(t *testing.T) {
	s, srv := newServer(t, Options{Seed: 5, Objects: 40})
	key := s.APIKey()
	b := list(t, srv.URL, key, backstop.Payments, "", 10, "")
	if got := list(t, srv.URL, key, backstop.Payments, b.Meta.NextCursor, 10, ""); len(got.Data) != 10 {
		t.Fatalf("cursor before invalidation: %d objects", len(got.Data))
	}
	s.InvalidateCursors()
	resp, body := do(t, srv.URL, key, "/public/v1/payments", listQuery(b.Meta.NextCursor, 10, ""))
	checkError(t, resp, body, http.StatusBadRequest, "invalid_cursor")
	// Cursors issued after the invalidation work.
	fresh := list(t, srv.URL, key, backstop.Payments, "", 10, "")
	got, _, _ := walk(t, srv.URL, key, backstop.Payments, fresh.Meta.NextCursor, 10, "")
	sameObjects(t, got, s.Objects(backstop.Payments)[10:])
}

func TestUnauthorized(t *testing.T) {
	s, srv := newServer(t, Options{Seed: 6, Objects: 5, APIKey: "right"})
	if s.APIKey() != "right" {
		t.Fatalf("APIKey %q", s.APIKey())
	}
	for _, key := range []string{"", "wrong", "right2"} {
		resp, body := do(t, srv.URL, key, "/public/v1/contacts", nil)
		checkError(t, resp, body, http.StatusUnauthorized, "unauthorized")
	}
	list(t, srv.URL, "right", backstop.Contacts, "", 0, "")
	st := s.Stats()
	if st.Unauthorized != 3 || st.Requests != 1 {
		t.Fatalf("stats %+v, want 3 unauthorized, 1 request", st)
	}
	if New(Options{Objects: -1}).APIKey() != DefaultAPIKey {
		t.Fatal("default API key")
	}
}

// clock is a settable fake clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.t = t }

func TestRateLimit(t *testing.T) {
	const start = 1_800_000_000 // a multiple of 60
	end := time.Unix(start+60, 0).UTC()
	for _, tc := range []struct {
		form string
		want []string // Retry-After of successive 429s
	}{
		{RetryAfterSeconds, []string{"31", "31"}},
		{"", []string{"31"}},
		{RetryAfterDate, []string{"Fri, 15 Jan 2027 08:01:00 GMT"}},
		{RetryAfterMixed, []string{"31", end.Format(http.TimeFormat), "Friday, 15-Jan-27 08:01:00 GMT", "Fri Jan 15 08:01:00 2027", "31"}},
	} {
		t.Run(tc.form, func(t *testing.T) {
			clk := &clock{t: time.Unix(start+29, 500_000_000)}
			s, srv := newServer(t, Options{Seed: 7, Objects: 10, Limit: 3, Window: time.Minute, RetryAfter: tc.form, Now: clk.Now})
			for i := range 3 {
				resp, body := do(t, srv.URL, s.APIKey(), "/public/v1/contacts", nil)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
				}
				checkLimitHeaders(t, resp, 3, 2-i, start+60)
			}
			for i, want := range tc.want {
				resp, body := do(t, srv.URL, s.APIKey(), "/public/v1/contacts", nil)
				checkError(t, resp, body, http.StatusTooManyRequests, "rate_limited")
				checkLimitHeaders(t, resp, 3, 0, start+60)
				if got := resp.Header.Get("Retry-After"); got != want {
					t.Errorf("429 #%d: Retry-After %q, want %q", i, got, want)
				}
				if ra, err := http.ParseTime(resp.Header.Get("Retry-After")); err == nil && !ra.Equal(end) {
					t.Errorf("Retry-After date %s, want %s", ra, end)
				}
			}
			// The next window starts afresh.
			clk.Set(time.Unix(start+60, 0))
			resp, _ := do(t, srv.URL, s.APIKey(), "/public/v1/contacts", nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("next window: %d", resp.StatusCode)
			}
			checkLimitHeaders(t, resp, 3, 2, start+120)

			st := s.Stats()
			n429 := len(tc.want)
			if st.Requests != 4+n429 || st.RateLimited != n429 || st.Errors != 0 {
				t.Errorf("stats %+v", st)
			}
			wantWin := []WindowStat{
				{Start: time.Unix(start, 0).UTC(), Length: time.Minute, Requests: 3, RateLimited: n429},
				{Start: time.Unix(start+60, 0).UTC(), Length: time.Minute, Requests: 1},
			}
			if fmt.Sprint(st.Windows) != fmt.Sprint(wantWin) {
				t.Errorf("windows %v, want %v", st.Windows, wantWin)
			}
		})
	}
}

func TestSetLimitAndUnlimitedHeaders(t *testing.T) {
	clk := &clock{t: time.Unix(1_800_000_005, 0)}
	s, srv := newServer(t, Options{Seed: 8, Objects: 10, Now: clk.Now})
	resp, _ := do(t, srv.URL, s.APIKey(), "/public/v1/chats", nil)
	checkLimitHeaders(t, resp, UnlimitedLimit, UnlimitedLimit-1, 1_800_000_060)

	s.SetLimit(2, 10*time.Second)
	for range 2 {
		if resp, _ := do(t, srv.URL, s.APIKey(), "/public/v1/chats", nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	resp, _ = do(t, srv.URL, s.APIKey(), "/public/v1/chats", nil)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "5" {
		t.Fatalf("status %d Retry-After %q, want 429 and 5", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	checkLimitHeaders(t, resp, 2, 0, 1_800_000_010)
}

func checkLimitHeaders(t *testing.T, resp *http.Response, limit, remaining int, reset int64) {
	t.Helper()
	h := resp.Header
	if h.Get("X-RateLimit-Limit") != strconv.Itoa(limit) ||
		h.Get("X-RateLimit-Remaining") != strconv.Itoa(remaining) ||
		h.Get("X-RateLimit-Reset") != strconv.FormatInt(reset, 10) {
		t.Fatalf("X-RateLimit-* = %s/%s/%s, want %d/%d/%d",
			h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"), h.Get("X-RateLimit-Reset"), limit, remaining, reset)
	}
}

func TestMutations(t *testing.T) {
	clk := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 123_456_789, time.UTC)}
	s, srv := newServer(t, Options{Seed: 9, Objects: 200, Now: clk.Now})
	key := s.APIKey()
	saved := map[backstop.Resource]string{}
	before := map[backstop.Resource]int{}
	seedIDs := map[string]bool{}
	var latest time.Time
	for _, r := range backstop.Resources {
		objs, _, cur := walk(t, srv.URL, key, r, "", 200, "")
		saved[r], before[r] = cur, len(objs)
		for _, o := range objs {
			seedIDs[o.ID] = true
		}
		if u := objs[len(objs)-1].UpdatedAt; u.After(latest) {
			latest = u
		}
		// At the end, an empty page returns the cursor it was given.
		b := list(t, srv.URL, key, r, cur, 10, "")
		if len(b.Data) != 0 || b.Meta.HasMore || b.Meta.NextCursor != cur {
			t.Fatalf("%s: page after the end: %d objects, has_more %v, cursor changed %v", r, len(b.Data), b.Meta.HasMore, b.Meta.NextCursor != cur)
		}
	}

	muts := s.Mutate(120)
	if len(muts) != 120 {
		t.Fatalf("Mutate returned %d objects", len(muts))
	}
	final := map[backstop.Resource]map[string]backstop.Object{}
	creates := map[backstop.Resource]int{}
	for i, m := range muts {
		if !m.UpdatedAt.After(latest) {
			t.Fatalf("mutation %d: updated_at %s not after %s", i, m.UpdatedAt, latest)
		}
		latest = m.UpdatedAt
		if final[m.Resource] == nil {
			final[m.Resource] = map[string]backstop.Object{}
		}
		if _, seen := final[m.Resource][m.ID]; !seen && !seedIDs[m.ID] {
			creates[m.Resource]++
		}
		final[m.Resource][m.ID] = m
		if got, ok := s.Object(m.Resource, m.ID); !ok || got.UpdatedAt.Before(m.UpdatedAt) {
			t.Fatalf("Object(%s) after Mutate: %v %v", m.ID, got.UpdatedAt, ok)
		}
	}
	if muts[0].UpdatedAt.Format(timeLayout) != "2026-03-01T12:00:00.123456Z" {
		t.Errorf("first mutation at %s, want Now truncated to µs", muts[0].UpdatedAt.Format(timeLayout))
	}
	updates := 0
	for _, r := range backstop.Resources {
		got, _, _ := walk(t, srv.URL, key, r, saved[r], 7, "")
		if len(got) != len(final[r]) {
			t.Fatalf("%s: %d objects after the saved cursor, want %d", r, len(got), len(final[r]))
		}
		for _, o := range got {
			want := final[r][o.ID]
			if !o.UpdatedAt.Equal(want.UpdatedAt) || !bytes.Equal(o.Data, want.Data) {
				t.Fatalf("%s %s: got version %s, want %s", r, o.ID, o.UpdatedAt, want.UpdatedAt)
			}
		}
		all := s.Objects(r)
		if len(all) != before[r]+creates[r] {
			t.Fatalf("%s: %d objects, want %d + %d created", r, len(all), before[r], creates[r])
		}
		// The mutated objects are the tail of the feed.
		sameObjects(t, all[len(all)-len(got):], got)
		updates += len(final[r]) - creates[r]
	}
	if updates == 0 || updates == len(muts) {
		t.Errorf("want a mix of creates and updates, got %d updates of %d", updates, len(muts))
	}
}

func TestDeterministic(t *testing.T) {
	at := time.Date(2026, 5, 5, 5, 5, 5, 0, time.UTC)
	now := func() time.Time { return at }
	a := New(Options{Seed: 42, Objects: 300, Now: now})
	b := New(Options{Seed: 42, Objects: 300, Now: now})
	c := New(Options{Seed: 43, Objects: 300, Now: now})
	for _, r := range backstop.Resources {
		sameObjects(t, b.Objects(r), a.Objects(r))
		if bytes.Equal(a.Objects(r)[0].Data, c.Objects(r)[0].Data) {
			t.Errorf("%s: seeds 42 and 43 give the same first object", r)
		}
	}
	ma, mb := a.Mutate(50), b.Mutate(50)
	sameObjects(t, mb, ma)
	for _, r := range backstop.Resources {
		sameObjects(t, b.Objects(r), a.Objects(r))
	}
}

func TestSeedData(t *testing.T) {
	s, srv := newServer(t, Options{Seed: 10, Objects: 400})
	var text strings.Builder
	for _, r := range backstop.Resources {
		objs := s.Objects(r)
		equal := 0
		for i, o := range objs {
			if !strings.HasPrefix(o.ID, r.IDPrefix()) {
				t.Fatalf("%s: id %q", r, o.ID)
			}
			if o.UpdatedAt.Before(BaseTime) || o.UpdatedAt.After(BaseTime.Add(seedSpan)) {
				t.Fatalf("%s: updated_at %s out of the seed span", r, o.UpdatedAt)
			}
			if i > 0 && o.UpdatedAt.Equal(objs[i-1].UpdatedAt) {
				equal++
			}
			var m map[string]any
			if err := json.Unmarshal(o.Data, &m); err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{"created_at", "updated_at"} {
				v, _ := m[f].(string)
				if _, err := time.Parse(timeLayout, v); err != nil {
					t.Fatalf("%s %s: %s %q: %v", r, o.ID, f, v, err)
				}
			}
			if m["updated_at"].(string) < m["created_at"].(string) {
				t.Fatalf("%s %s: created after updated", r, o.ID)
			}
			checkFields(t, r, m)
			for _, v := range m {
				if str, ok := v.(string); ok {
					text.WriteString(str)
				}
			}
		}
		if equal < len(objs)/5 || equal > len(objs)/2 {
			t.Errorf("%s: %d of %d objects share the previous updated_at, want about 30%%", r, equal, len(objs))
		}
	}
	for _, want := range []string{"ж", "Ł", "ł", "ę", "ż", "王", "🚀", "👍", "\n"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("seed data lacks %q", want)
		}
	}

	// Big objects: DefaultBigObjects messages over 64 KiB, served whole by
	// list and by id.
	var big []backstop.Object
	for _, r := range backstop.Resources {
		for _, o := range s.Objects(r) {
			if len(o.Data) > 64<<10 {
				big = append(big, o)
			}
		}
	}
	if len(big) != DefaultBigObjects {
		t.Fatalf("%d objects over 64 KiB, want %d", len(big), DefaultBigObjects)
	}
	for _, o := range big {
		if o.Resource != backstop.Messages {
			t.Errorf("big object of %s", o.Resource)
		}
		resp, body := do(t, srv.URL, s.APIKey(), "/public/v1/messages/"+o.ID, nil)
		if resp.StatusCode != http.StatusOK || !bytes.Equal(body, o.Data) {
			t.Fatalf("GET %s: %d, %d bytes, want %d", o.ID, resp.StatusCode, len(body), len(o.Data))
		}
	}
	got, _, _ := walk(t, srv.URL, s.APIKey(), backstop.Messages, "", 200, "")
	sameObjects(t, got, s.Objects(backstop.Messages))

	if n := len(New(Options{Seed: 10, Objects: 20, BigObjects: -1}).bigMessages()); n != 0 {
		t.Errorf("BigObjects -1: %d big messages", n)
	}
	if n := len(New(Options{Seed: 10, Objects: 20, BigObjects: 5}).bigMessages()); n != 5 {
		t.Errorf("BigObjects 5: %d big messages", n)
	}
	if n := New(Options{Objects: -1}).Len(backstop.Contacts); n != 0 {
		t.Errorf("Objects -1: %d contacts", n)
	}
	if n := New(Options{}).Len(backstop.Contacts); n != DefaultObjects {
		t.Errorf("Objects 0: %d contacts", n)
	}
}

func (s *Sim) bigMessages() []backstop.Object {
	var out []backstop.Object
	for _, o := range s.Objects(backstop.Messages) {
		if len(o.Data) > 64<<10 {
			out = append(out, o)
		}
	}
	return out
}

func checkFields(t *testing.T, r backstop.Resource, m map[string]any) {
	t.Helper()
	oneOf := func(f string, vals ...string) {
		t.Helper()
		v, _ := m[f].(string)
		for _, w := range vals {
			if v == w {
				return
			}
		}
		t.Fatalf("%s %v: %s %q not in %v", r, m["id"], f, v, vals)
	}
	nonEmpty := func(fs ...string) {
		t.Helper()
		for _, f := range fs {
			if v, _ := m[f].(string); v == "" {
				t.Fatalf("%s %v: empty %s", r, m["id"], f)
			}
		}
	}
	switch r {
	case backstop.Contacts:
		nonEmpty("name", "email", "phone")
	case backstop.Chats:
		nonEmpty("contact_id")
		oneOf("channel", channels...)
		oneOf("status", "opened", "closed")
	case backstop.Messages:
		nonEmpty("chat_id", "text")
		oneOf("direction", "in", "out")
	case backstop.Payments:
		nonEmpty("contact_id", "currency")
		oneOf("status", "pending", "succeeded", "failed", "refunded")
		if a, ok := m["amount"].(float64); !ok || a != float64(int64(a)) || a <= 0 {
			t.Fatalf("payment amount %v", m["amount"])
		}
	}
}

func TestErrorInjection(t *testing.T) {
	s, srv := newServer(t, Options{Seed: 11, Objects: 10, ErrorRate: 1})
	seen := map[int]bool{}
	for range 30 {
		resp, body := do(t, srv.URL, s.APIKey(), "/public/v1/contacts", nil)
		if resp.StatusCode < 500 {
			t.Fatalf("status %d with ErrorRate 1", resp.StatusCode)
		}
		checkError(t, resp, body, resp.StatusCode, failCodes[resp.StatusCode])
		if resp.Header.Get("X-RateLimit-Remaining") == "" {
			t.Fatal("no X-RateLimit-Remaining on an injected error")
		}
		seen[resp.StatusCode] = true
	}
	if len(seen) != 3 {
		t.Errorf("statuses %v, want 500, 502 and 503", seen)
	}
	if st := s.Stats(); st.Errors != 30 || st.Requests != 30 {
		t.Errorf("stats %+v", st)
	}
	s.SetErrorRate(0)
	list(t, srv.URL, s.APIKey(), backstop.Contacts, "", 0, "")
}

func TestConcurrentListAndMutate(t *testing.T) {
	s, srv := newServer(t, Options{Seed: 12, Objects: 300})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; i < 400 && ctx.Err() == nil; i++ {
			s.Mutate(5)
		}
	})
	var readers sync.WaitGroup
	for _, r := range backstop.Resources {
		readers.Go(func() {
			for range 3 {
				objs, _, _ := walk(t, srv.URL, s.APIKey(), r, "", 37, "")
				for i := 1; i < len(objs); i++ {
					if objs[i-1].Position().Compare(objs[i].Position()) >= 0 {
						t.Errorf("%s: walk out of feed order at %d", r, i)
						return
					}
				}
				_ = s.Objects(r)
			}
		})
	}
	readers.Wait()
	cancel()
	wg.Wait()
}

func TestServeAndRun(t *testing.T) {
	s := New(Options{Seed: 13, Objects: 10, MutationRate: 500})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	base := "http://" + ln.Addr().String()
	list(t, base, s.APIKey(), backstop.Contacts, "", 0, "")

	// Run mutates in the background: poll until the feeds grow.
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for total := 0; total < 40+20; {
		select {
		case <-deadline:
			t.Fatalf("Run made %d mutations in 10s", total-40)
		case <-tick.C:
		}
		total = 0
		for _, r := range backstop.Resources {
			total += s.Len(r)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
}

func TestRunWithoutRateWaitsForCancel(t *testing.T) {
	s := New(Options{Objects: -1})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	cancel()
	<-done
	if s.Len(backstop.Contacts) != 0 {
		t.Fatal("Run with no rate mutated")
	}
}

func TestLatency(t *testing.T) {
	s, srv := newServer(t, Options{Seed: 14, Objects: 5, Latency: 50 * time.Millisecond})
	start := time.Now()
	list(t, srv.URL, s.APIKey(), backstop.Contacts, "", 0, "")
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("response after %s, want at least the 50ms latency", d)
	}
}

func TestCursorRoundTrip(t *testing.T) {
	for _, c := range []cursor{
		{},
		{res: 3, gen: 7},
		{res: 1, gen: 1 << 40, hasPos: true, ts: BaseTime.UnixNano(), id: "chat_0123456789abcdef"},
		{res: 2, hasPos: true, ts: -5, id: "msg_ünïcode"},
	} {
		got, err := decodeCursor(c.encode())
		if err != nil || got != c {
			t.Errorf("decode(encode(%+v)) = %+v, %v", c, got, err)
		}
	}
	for _, bad := range []string{"", "!!!", "AA", "AgAA", "AQAC", "AQAA"} {
		if _, err := decodeCursor(bad); err == nil {
			t.Errorf("decodeCursor(%q) succeeded", bad)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, o := range []Options{
		{RetryAfter: "minutes"}, {Limit: -1}, {Window: -time.Second}, {ErrorRate: 1.5},
		{ErrorRate: -0.1}, {Latency: -1}, {MutationRate: -1},
		// Not a number passed every comparison: NaN rates were taken, and
		// made nothing (NaN mutations per second) or never failed.
		{ErrorRate: math.NaN()}, {MutationRate: math.NaN()}, {MutationRate: math.Inf(1)},
		{DropRate: math.NaN()}, {DuplicateRate: math.NaN()}, {ReorderRate: math.NaN()},
	} {
		if o.Validate() == nil {
			t.Errorf("Validate(%+v) = nil", o)
		}
	}
	if err := (Options{RetryAfter: RetryAfterMixed, Limit: 30, ErrorRate: 1}).Validate(); err != nil {
		t.Error(err)
	}
}

// BenchmarkListPage200 measures the handler serving pages of 200 messages
// against a baseline of encoding/json marshalling the same page, and prints
// one BENCH line.
func BenchmarkListPage200(b *testing.B) {
	const rounds = 500
	s := New(Options{Seed: 1, Objects: 100_000})
	h := s.Handler()
	c := list(b, httptestURL(b, h), s.APIKey(), backstop.Messages, "", 200, "").Meta.NextCursor
	req := httptest.NewRequest(http.MethodGet, "/public/v1/messages?cursor_limit=200&cursor="+c, nil)
	req.Header.Set("Authorization", "Bearer "+s.APIKey())
	page := s.Objects(backstop.Messages)[200:400]
	var objs []map[string]any
	for _, o := range page {
		var m map[string]any
		if err := json.Unmarshal(o.Data, &m); err != nil {
			b.Fatal(err)
		}
		objs = append(objs, m)
	}
	var serve, marshal time.Duration
	for range b.N {
		start := time.Now()
		for range rounds {
			w := &discard{header: http.Header{}}
			h.ServeHTTP(w, req)
			if w.code != http.StatusOK {
				b.Fatal(w.code)
			}
		}
		serve += time.Since(start)
		start = time.Now()
		for range rounds {
			if _, err := json.Marshal(map[string]any{"data": objs, "meta": map[string]any{"next_cursor": c, "has_more": true}}); err != nil {
				b.Fatal(err)
			}
		}
		marshal += time.Since(start)
	}
	n := float64(b.N * rounds)
	fmt.Printf("BENCH sim-list-page page=200 pages_per_s=%.0f json_marshal_pages_per_s=%.0f ratio=%.2f\n",
		n/serve.Seconds(), n/marshal.Seconds(), marshal.Seconds()/serve.Seconds())
}

// discard is a ResponseWriter that keeps only the status, so that the
// benchmark measures the handler rather than a recorder's buffer.
type discard struct {
	header http.Header
	code   int
}

func (d *discard) Header() http.Header         { return d.header }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(code int)        { d.code = code }

func httptestURL(b *testing.B, h http.Handler) string {
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	return srv.URL
}
