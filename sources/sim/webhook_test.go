package sim

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
)

const testSecret = "sim-webhook-secret ключ"

// arrival is one request a receiver got.
type arrival struct {
	header http.Header
	body   []byte
	at     time.Time
	status int
}

// receiver is a real HTTP webhook receiver that records every request and
// answers with status(request).
type receiver struct {
	srv    *httptest.Server
	status func(*http.Request) int
	signal chan struct{} // capacity 1: something arrived

	mu  sync.Mutex
	got []arrival
}

func newReceiver(t *testing.T, status func(*http.Request) int) *receiver {
	t.Helper()
	if status == nil {
		status = func(*http.Request) int { return http.StatusOK }
	}
	rc := &receiver{status: status, signal: make(chan struct{}, 1)}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		st := rc.status(r)
		rc.mu.Lock()
		rc.got = append(rc.got, arrival{header: r.Header.Clone(), body: body, at: time.Now(), status: st})
		rc.mu.Unlock()
		select {
		case rc.signal <- struct{}{}:
		default:
		}
		w.WriteHeader(st)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) arrivals() []arrival {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.got)
}

// waitFor waits until at least n requests have arrived.
func (rc *receiver) waitFor(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for len(rc.arrivals()) < n {
		select {
		case <-rc.signal:
		case <-deadline:
			t.Fatalf("%d requests arrived in 10s, want %d", len(rc.arrivals()), n)
		}
	}
}

// webhookSim returns a Sim sending to rc, its sender started for the test.
func webhookSim(t *testing.T, rc *receiver, opts Options) *Sim {
	t.Helper()
	opts.WebhookURL = rc.srv.URL
	opts.WebhookSecret = testSecret
	if opts.Objects == 0 {
		opts.Objects = 20
	}
	s := New(opts)
	s.StartWebhooks(t.Context())
	return s
}

func waitIdle(t *testing.T, s *Sim) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := s.WebhooksIdle(ctx); err != nil {
		t.Fatalf("WebhooksIdle: %v", err)
	}
}

// byEventID groups arrivals by their X-Event-Id.
func byEventID(as []arrival) map[string][]arrival {
	m := make(map[string][]arrival)
	for _, a := range as {
		id := a.header.Get("X-Event-Id")
		m[id] = append(m[id], a)
	}
	return m
}

var createdAtForm = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$`)

func TestWebhookEnvelopeAndSignature(t *testing.T) {
	rc := newReceiver(t, nil)
	s := webhookSim(t, rc, Options{Seed: 31})
	existed := make(map[string]bool)
	for _, r := range backstop.Resources {
		for _, o := range s.Objects(r) {
			existed[o.ID] = true
		}
	}
	muts := s.Mutate(300)
	created := make([]bool, len(muts)) // in the order the versions were made
	for i, m := range muts {
		created[i] = !existed[m.ID]
		existed[m.ID] = true
	}
	waitIdle(t, s)

	events := s.Events()
	if len(events) != len(muts) {
		t.Fatalf("%d events for %d mutations", len(events), len(muts))
	}
	index := make(map[string]int)
	for i, ev := range events {
		m := muts[i]
		if ev.ObjectID != m.ID || ev.Resource != m.Resource || !ev.UpdatedAt.Equal(m.UpdatedAt) || ev.Dropped {
			t.Fatalf("event %d = %+v, want mutation %s %s %s", i, ev, m.Resource, m.ID, m.UpdatedAt)
		}
		index[ev.ID] = i
	}
	got := rc.arrivals()
	if len(got) != len(muts) {
		t.Fatalf("%d webhooks arrived for %d mutations", len(got), len(muts))
	}
	known := append(slices.Clone(backstop.KnownEventTypes), "message.updated")
	types := make(map[string]int)
	requestIDs := make(map[string]bool)
	bigs := 0
	for _, a := range got {
		// The signature, checked independently of Sign.
		mac := hmac.New(sha256.New, []byte(testSecret))
		mac.Write(a.body)
		want := hex.EncodeToString(mac.Sum(nil))
		if sig := a.header.Get("X-Botix-Signature"); sig != want {
			t.Fatalf("X-Botix-Signature %q, want %q", sig, want)
		}
		if ct := a.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q", ct)
		}
		if a.header.Get("X-Delivery-Attempt") != "1" {
			t.Errorf("X-Delivery-Attempt %q", a.header.Get("X-Delivery-Attempt"))
		}
		rid := a.header.Get("X-Request-Id")
		if rid == "" || requestIDs[rid] {
			t.Errorf("X-Request-Id %q empty or repeated", rid)
		}
		requestIDs[rid] = true

		var keys map[string]json.RawMessage
		if err := json.Unmarshal(a.body, &keys); err != nil {
			t.Fatalf("body %s: %v", a.body, err)
		}
		m := muts[index[string(bytes.Trim(keys["event_id"], `"`))]]
		big := len(m.Data) > DefaultTruncateOver-200
		if big {
			bigs++
			if string(keys["truncated"]) != "true" || string(keys["data"]) != `{"id":"`+m.ID+`"}` {
				t.Errorf("big version of %s sent as %.200s", m.ID, a.body)
			}
			delete(keys, "truncated")
		}
		if len(keys) != 4 {
			t.Errorf("envelope keys %v, want event_id, event, created_at, data", slices.Collect(func(yield func(string) bool) {
				for k := range keys {
					yield(k)
				}
			}))
		}
		var env struct {
			EventID   string          `json:"event_id"`
			Event     string          `json:"event"`
			CreatedAt string          `json:"created_at"`
			Data      json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(a.body, &env); err != nil {
			t.Fatal(err)
		}
		i, ok := index[env.EventID]
		if !ok || !strings.HasPrefix(env.EventID, "evt_") || a.header.Get("X-Event-Id") != env.EventID {
			t.Fatalf("event_id %q (header %q) unknown", env.EventID, a.header.Get("X-Event-Id"))
		}
		if a.header.Get("X-Event-Type") != env.Event || events[i].Type != env.Event {
			t.Errorf("X-Event-Type %q, event %q, Events %q", a.header.Get("X-Event-Type"), env.Event, events[i].Type)
		}
		if !createdAtForm.MatchString(env.CreatedAt) {
			t.Errorf("created_at %q", env.CreatedAt)
		}
		if !big && !bytes.Equal(env.Data, m.Data) {
			t.Fatalf("data of %s differs from the API's:\n%.300s\n%.300s", m.ID, env.Data, m.Data)
		}
		if !bytes.Equal(a.body, events[i].Body) {
			t.Errorf("body of %s differs from Events()", env.EventID)
		}
		if !slices.Contains(known, env.Event) {
			t.Errorf("event type %q", env.Event)
		}
		if r, ok := backstop.ResourceOfEventType(env.Event); !ok || r != m.Resource {
			t.Errorf("type %q for a %s", env.Event, m.Resource)
		}
		if want := wantType(t, m, created[i]); env.Event != want {
			t.Errorf("type %q for %.300s, want %q", env.Event, m.Data, want)
		}
		types[env.Event]++
	}
	for _, typ := range []string{"contact.created", "contact.updated", "chat.opened", "message.created", "message.updated"} {
		if types[typ] == 0 {
			t.Errorf("no %s among %v", typ, types)
		}
	}
	if bigs == 0 {
		t.Error("no big message was updated")
	}
	st := s.WebhookStats()
	if st != (WebhookStats{Events: 300, Attempts: 300, Delivered: 300}) {
		t.Errorf("stats %+v", st)
	}
}

// wantType is the event type the contract gives a version of an object.
func wantType(t *testing.T, o backstop.Object, created bool) string {
	t.Helper()
	var v struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(o.Data, &v); err != nil {
		t.Fatal(err)
	}
	switch o.Resource {
	case backstop.Contacts:
		if created {
			return "contact.created"
		}
		return "contact.updated"
	case backstop.Chats:
		// A new chat may start closed: its state names it.
		return "chat." + v.Status
	case backstop.Messages:
		if created {
			return "message.created"
		}
		return "message.updated"
	}
	return "payment." + v.Status
}

func TestWebhookDropRate(t *testing.T) {
	rc := newReceiver(t, nil)
	s := webhookSim(t, rc, Options{Seed: 32, DropRate: 0.25})
	s.Mutate(800)
	waitIdle(t, s)

	got := byEventID(rc.arrivals())
	logged := make(map[string]bool)
	for _, a := range s.WebhookLog() {
		logged[a.EventID] = true
	}
	dropped := 0
	for _, ev := range s.Events() {
		switch {
		case ev.Dropped:
			dropped++
			if len(got[ev.ID]) != 0 || logged[ev.ID] {
				t.Errorf("dropped event %s was attempted", ev.ID)
			}
		case len(got[ev.ID]) != 1 || !logged[ev.ID] || !ev.Delivered:
			t.Errorf("event %s arrived %d times, logged %v, delivered %v", ev.ID, len(got[ev.ID]), logged[ev.ID], ev.Delivered)
		}
	}
	// 800 × 0.25 = 200, σ ≈ 12.
	if dropped < 150 || dropped > 250 {
		t.Errorf("%d of 800 dropped at rate 0.25", dropped)
	}
	st := s.WebhookStats()
	if st.Events != 800 || st.Dropped != dropped || st.Delivered != 800-dropped || st.Attempts != 800-dropped {
		t.Errorf("stats %+v with %d dropped", st, dropped)
	}
}

func TestWebhookDuplicates(t *testing.T) {
	rc := newReceiver(t, nil)
	s := webhookSim(t, rc, Options{Seed: 33, DuplicateRate: 0.4})
	s.Mutate(300)
	waitIdle(t, s)

	got := byEventID(rc.arrivals())
	dups := 0
	for _, ev := range s.Events() {
		as := got[ev.ID]
		if !ev.Duplicated {
			if len(as) != 1 {
				t.Errorf("event %s arrived %d times", ev.ID, len(as))
			}
			continue
		}
		dups++
		if len(as) != 2 {
			t.Fatalf("duplicated event %s arrived %d times", ev.ID, len(as))
		}
		if !bytes.Equal(as[0].body, as[1].body) || as[0].header.Get("X-Request-Id") == as[1].header.Get("X-Request-Id") {
			t.Errorf("copies of %s: different bodies or the same request id", ev.ID)
		}
		for _, a := range as {
			var env struct {
				EventID string `json:"event_id"`
			}
			if err := json.Unmarshal(a.body, &env); err != nil || env.EventID != ev.ID {
				t.Errorf("copy of %s has event_id %q (%v)", ev.ID, env.EventID, err)
			}
			if a.header.Get("X-Delivery-Attempt") != "1" {
				t.Errorf("copy of %s is attempt %s, want a separate delivery", ev.ID, a.header.Get("X-Delivery-Attempt"))
			}
		}
	}
	if dups < 80 || dups > 160 {
		t.Errorf("%d of 300 duplicated at rate 0.4", dups)
	}
	marked := 0
	for _, a := range s.WebhookLog() {
		if a.Duplicate {
			marked++
		}
	}
	st := s.WebhookStats()
	if marked != dups || st.Duplicated != dups || st.Attempts != 300+dups || st.Delivered != 300 {
		t.Errorf("stats %+v, %d log entries marked duplicate, %d duplicated", st, marked, dups)
	}
}

func TestWebhookReorder(t *testing.T) {
	rc := newReceiver(t, nil)
	// One worker and no failures: the arrival order is the send order.
	s := webhookSim(t, rc, Options{Seed: 34, ReorderRate: 0.2, WebhookWorkers: 1})
	s.Mutate(300)
	waitIdle(t, s)

	pos := make(map[string]int)
	for i, a := range rc.arrivals() {
		pos[a.header.Get("X-Event-Id")] = i
	}
	events := s.Events()
	if len(pos) != len(events) {
		t.Fatalf("%d of %d events arrived", len(pos), len(events))
	}
	reordered, late, prev := 0, 0, -1
	for i, ev := range events {
		if !ev.Reordered {
			if pos[ev.ID] < prev {
				t.Errorf("event %d arrived before an earlier event, neither reordered", i)
			}
			prev = pos[ev.ID]
			continue
		}
		reordered++
		// A reordered event waits for at least the next event that is not
		// reordered itself.
		j := slices.IndexFunc(events[i+1:], func(e SentEvent) bool { return !e.Reordered })
		if j < 0 {
			continue // flushed by WebhooksIdle
		}
		if pos[ev.ID] < pos[events[i+1+j].ID] {
			t.Errorf("reordered event %d arrived before later event %d", i, i+1+j)
		}
		late++
	}
	if reordered < 30 || late == 0 || s.WebhookStats().Reordered != reordered {
		t.Errorf("%d reordered (%d arrived after a later event), stats %+v", reordered, late, s.WebhookStats())
	}
}

func TestWebhookRetriesFollowScheduleThenGiveUp(t *testing.T) {
	var failID string
	var mu sync.Mutex
	rc := newReceiver(t, func(r *http.Request) int {
		mu.Lock()
		defer mu.Unlock()
		if r.Header.Get("X-Event-Id") == failID {
			return http.StatusInternalServerError
		}
		return http.StatusNoContent
	})
	schedule := []time.Duration{200 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond}
	s := New(Options{Seed: 35, Objects: 20, WebhookURL: rc.srv.URL, RetrySchedule: schedule, WebhookWorkers: 1})
	s.Mutate(5) // queued before the sender starts
	mu.Lock()
	failID = s.Events()[0].ID
	mu.Unlock()
	s.StartWebhooks(t.Context())
	waitIdle(t, s)

	var tries []arrival
	others := 0
	for _, a := range rc.arrivals() {
		if a.header.Get("X-Event-Id") != failID {
			others++
			if len(tries) > 1 {
				t.Error("a retry held up the only worker: another event arrived after it")
			}
			continue
		}
		tries = append(tries, a)
	}
	if len(tries) != 1+len(schedule) || others != 4 {
		t.Fatalf("%d attempts of the failing event, %d others", len(tries), others)
	}
	for i, a := range tries {
		if a.header.Get("X-Delivery-Attempt") != strconv.Itoa(i+1) {
			t.Errorf("attempt %d has X-Delivery-Attempt %q", i+1, a.header.Get("X-Delivery-Attempt"))
		}
		if i > 0 {
			if gap := a.at.Sub(tries[i-1].at); gap < schedule[i-1] {
				t.Errorf("retry %d came %s after the previous attempt, want at least %s", i, gap, schedule[i-1])
			}
		}
	}
	var log []WebhookAttempt
	for _, a := range s.WebhookLog() {
		if a.EventID == failID {
			log = append(log, a)
		}
	}
	for i, a := range log {
		if a.Attempt != i+1 || a.Status != http.StatusInternalServerError || a.Err != "" || a.RequestID != tries[i].header.Get("X-Request-Id") {
			t.Errorf("log %d: %+v", i, a)
		}
	}
	st := s.WebhookStats()
	if len(log) != 4 || st.Attempts != 8 || st.Retries != 3 || st.GaveUp != 1 || st.Delivered != 4 || s.Events()[0].Delivered {
		t.Errorf("stats %+v, %d log entries of the failing event", st, len(log))
	}
}

func TestWebhookDeliveredOnSecondAttempt(t *testing.T) {
	rc := newReceiver(t, func(r *http.Request) int {
		if r.Header.Get("X-Delivery-Attempt") == "1" {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	s := webhookSim(t, rc, Options{Seed: 36, RetrySchedule: []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond}})
	s.Mutate(10)
	waitIdle(t, s)

	perEvent := make(map[string][]int)
	for _, a := range s.WebhookLog() {
		if a.Attempt != len(perEvent[a.EventID])+1 {
			t.Errorf("%s: attempt %d after %d", a.EventID, a.Attempt, len(perEvent[a.EventID]))
		}
		perEvent[a.EventID] = append(perEvent[a.EventID], a.Status)
	}
	for _, ev := range s.Events() {
		if !slices.Equal(perEvent[ev.ID], []int{503, 200}) || !ev.Delivered {
			t.Errorf("%s: statuses %v, delivered %v", ev.ID, perEvent[ev.ID], ev.Delivered)
		}
	}
	if st := s.WebhookStats(); st != (WebhookStats{Events: 10, Attempts: 20, Delivered: 10, Retries: 10}) {
		t.Errorf("stats %+v", st)
	}
}

func TestWebhookConnectionErrorsAreRetried(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String() + "/hook"
	ln.Close() // nothing listens: every attempt is refused
	s := New(Options{Seed: 37, Objects: 5, WebhookURL: url, RetrySchedule: []time.Duration{10 * time.Millisecond}})
	s.StartWebhooks(t.Context())
	s.Mutate(1)
	waitIdle(t, s)
	log := s.WebhookLog()
	if len(log) != 2 {
		t.Fatalf("%d attempts, want 2", len(log))
	}
	for i, a := range log {
		if a.Attempt != i+1 || a.Status != 0 || a.Err == "" {
			t.Errorf("attempt %d: %+v", i+1, a)
		}
	}
	if st := s.WebhookStats(); st.GaveUp != 1 || st.Delivered != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestWebhookTruncatesBigObjects(t *testing.T) {
	rc := newReceiver(t, nil)
	s := webhookSim(t, rc, Options{Seed: 38, Objects: 50, BigObjects: 2})
	big := s.bigMessages()
	if len(big) == 0 {
		t.Fatal("no big messages in the seed data")
	}
	small := s.Objects(backstop.Messages)[0]
	if len(small.Data) > 1000 {
		small = s.Objects(backstop.Messages)[1]
	}
	bigV, ok1 := s.Update(backstop.Messages, big[0].ID)
	smallV, ok2 := s.Update(backstop.Messages, small.ID)
	if !ok1 || !ok2 || len(bigV.Data) <= DefaultTruncateOver {
		t.Fatalf("Update: %v %v, big version of %d bytes", ok1, ok2, len(bigV.Data))
	}
	waitIdle(t, s)

	got := rc.arrivals()
	if len(got) != 2 {
		t.Fatalf("%d webhooks, want 2", len(got))
	}
	for _, a := range got {
		var env struct {
			Event     string          `json:"event"`
			Data      json.RawMessage `json:"data"`
			Truncated *bool           `json:"truncated"`
		}
		if err := json.Unmarshal(a.body, &env); err != nil {
			t.Fatal(err)
		}
		if env.Event != "message.updated" || len(a.body) > DefaultTruncateOver {
			t.Errorf("event %q, body of %d bytes", env.Event, len(a.body))
		}
		var obj struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(env.Data, &obj); err != nil {
			t.Fatal(err)
		}
		switch obj.ID {
		case bigV.ID:
			if env.Truncated == nil || !*env.Truncated || string(env.Data) != `{"id":"`+bigV.ID+`"}` {
				t.Errorf("big message sent as %s, truncated %v", env.Data, env.Truncated)
			}
		case smallV.ID:
			if env.Truncated != nil || !bytes.Equal(env.Data, smallV.Data) {
				t.Errorf("small message sent as %.200s, truncated %v", env.Data, env.Truncated)
			}
		default:
			t.Errorf("webhook about %q", obj.ID)
		}
	}
	evs := s.Events()
	if !evs[0].Truncated || evs[1].Truncated {
		t.Errorf("Events truncated flags %v %v", evs[0].Truncated, evs[1].Truncated)
	}
}

func TestEnvelopeTruncationBoundary(t *testing.T) {
	rec := &record{id: "msg_0123456789abcdef", ts: BaseTime.UnixNano(), data: []byte(`{"id":"msg_0123456789abcdef","text":"Zażółć gęślą jaźń"}`)}
	whole, trunc := envelope("evt_x", "message.updated", rec, 1<<30)
	if trunc {
		t.Fatal("truncated under a huge limit")
	}
	want := `{"event_id":"evt_x","event":"message.updated","created_at":"2026-01-01T00:00:00.000000Z","data":` + string(rec.data) + `}`
	if string(whole) != want {
		t.Fatalf("envelope\n%s\nwant\n%s", whole, want)
	}
	for _, tc := range []struct {
		limit int
		trunc bool
	}{{len(whole), false}, {len(whole) - 1, true}} {
		b, trunc := envelope("evt_x", "message.updated", rec, tc.limit)
		if trunc != tc.trunc || (trunc && string(b) != `{"event_id":"evt_x","event":"message.updated","created_at":"2026-01-01T00:00:00.000000Z","data":{"id":"msg_0123456789abcdef"},"truncated":true}`) {
			t.Errorf("limit %d: %s (truncated %v)", tc.limit, b, trunc)
		}
	}
}

func TestUpdate(t *testing.T) {
	s := New(Options{Seed: 39, Objects: 50})
	c := s.Objects(backstop.Contacts)[0]
	v, ok := s.Update(backstop.Contacts, c.ID)
	if !ok || v.ID != c.ID || !v.UpdatedAt.After(c.UpdatedAt) || bytes.Equal(v.Data, c.Data) {
		t.Fatalf("Update = %+v, %v", v, ok)
	}
	if got, _ := s.Object(backstop.Contacts, c.ID); !bytes.Equal(got.Data, v.Data) {
		t.Error("Update not stored")
	}
	if _, ok := s.Update(backstop.Contacts, "ct_missing"); ok {
		t.Error("Update of a missing id succeeded")
	}
	if _, ok := s.Update("nope", c.ID); ok {
		t.Error("Update of an unknown resource succeeded")
	}
	for _, p := range s.Objects(backstop.Payments) {
		if bytes.Contains(p.Data, []byte(`"status":"failed"`)) {
			if _, ok := s.Update(backstop.Payments, p.ID); ok {
				t.Error("a failed payment changed")
			}
			return
		}
	}
	t.Fatal("no failed payment in the seed data")
}

func TestWebhooksIdle(t *testing.T) {
	t.Run("waits for the sender", func(t *testing.T) {
		rc := newReceiver(t, nil)
		s := New(Options{Seed: 40, Objects: 5, WebhookURL: rc.srv.URL, ReorderRate: 1})
		s.Mutate(3)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := s.WebhooksIdle(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("WebhooksIdle before StartWebhooks = %v, want context.Canceled", err)
		}
		s.StartWebhooks(t.Context())
		s.StartWebhooks(t.Context()) // idempotent
		waitIdle(t, s)               // also releases the held events
		if n := len(rc.arrivals()); n != 3 {
			t.Fatalf("%d arrived, want 3", n)
		}
	})
	t.Run("stopped", func(t *testing.T) {
		rc := newReceiver(t, func(*http.Request) int { return http.StatusBadGateway })
		s := New(Options{Seed: 41, Objects: 5, WebhookURL: rc.srv.URL}) // default schedule: next retry in 1m
		ctx, cancel := context.WithCancel(t.Context())
		s.StartWebhooks(ctx)
		s.Mutate(1)
		rc.waitFor(t, 1)
		cancel()
		wctx, wcancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer wcancel()
		if err := s.WebhooksIdle(wctx); !errors.Is(err, ErrWebhooksStopped) {
			t.Fatalf("WebhooksIdle after stop = %v, want ErrWebhooksStopped", err)
		}
	})
	t.Run("no webhooks", func(t *testing.T) {
		s := New(Options{Seed: 42, Objects: 5})
		s.StartWebhooks(t.Context())
		s.Mutate(5)
		if err := s.WebhooksIdle(t.Context()); err != nil || s.Events() != nil || s.WebhookLog() != nil || s.WebhookStats() != (WebhookStats{}) {
			t.Fatalf("without a URL: %v %v %v %+v", err, s.Events(), s.WebhookLog(), s.WebhookStats())
		}
	})
}

func TestWebhookConcurrentMutate(t *testing.T) {
	// A quarter of first attempts fail, by the last hex digit of the
	// request id.
	rc := newReceiver(t, func(r *http.Request) int {
		rid := r.Header.Get("X-Request-Id")
		if r.Header.Get("X-Delivery-Attempt") == "1" && strings.ContainsAny(rid[len(rid)-1:], "0123") {
			return http.StatusInternalServerError
		}
		return http.StatusAccepted
	})
	s := webhookSim(t, rc, Options{
		Seed: 43, DropRate: 0.1, DuplicateRate: 0.1, ReorderRate: 0.1,
		RetrySchedule: []time.Duration{5 * time.Millisecond, 5 * time.Millisecond},
	})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 5 {
				s.Mutate(5)
				_ = s.WebhookLog()
				_ = s.WebhookStats()
				_ = s.Events()
			}
		})
	}
	wg.Wait()
	waitIdle(t, s)

	ok := make(map[string]bool) // request ids answered 2xx
	got := rc.arrivals()
	for _, a := range got {
		if a.status < 300 {
			ok[a.header.Get("X-Request-Id")] = true
		}
	}
	log := s.WebhookLog()
	delivered := make(map[string]bool)
	for _, a := range log {
		if (a.Status >= 200 && a.Status < 300) != ok[a.RequestID] {
			t.Errorf("log %+v disagrees with the receiver", a)
		}
		if ok[a.RequestID] {
			delivered[a.EventID] = true
		}
	}
	events := s.Events()
	dropped := 0
	for _, ev := range events {
		if ev.Dropped {
			dropped++
		}
		if ev.Dropped == ev.Delivered || ev.Delivered != delivered[ev.ID] {
			t.Errorf("event %+v: delivered per log %v", ev, delivered[ev.ID])
		}
	}
	st := s.WebhookStats()
	if len(events) != 200 || st.Events != 200 || st.Attempts != len(log) || len(got) != len(log) ||
		st.Delivered != 200-dropped || st.GaveUp != 0 || st.Retries == 0 {
		t.Errorf("stats %+v: %d events, %d log entries, %d arrivals, %d dropped", st, len(events), len(log), len(got), dropped)
	}
}

func TestWebhookDecisionsAreDeterministic(t *testing.T) {
	flags := func(seed int64) []SentEvent {
		s := New(Options{Seed: seed, Objects: 20, WebhookURL: "http://127.0.0.1:1/", DropRate: 0.2, DuplicateRate: 0.2, ReorderRate: 0.2})
		s.Mutate(100)
		return s.Events()
	}
	same := func(a, b []SentEvent) bool {
		return slices.EqualFunc(a, b, func(x, y SentEvent) bool {
			return x.ObjectID == y.ObjectID && x.Type == y.Type && x.Dropped == y.Dropped && x.Duplicated == y.Duplicated && x.Reordered == y.Reordered
		})
	}
	a, b := flags(44), flags(44)
	if !same(a, b) {
		t.Error("the same seed made different decisions")
	}
	if same(a, flags(45)) {
		t.Error("another seed made the same decisions")
	}
	// Webhooks draw from their own source: the mutations are those of a
	// Sim without webhooks.
	plain := New(Options{Seed: 44, Objects: 20}).Mutate(100)
	for i, m := range plain {
		if m.ID != a[i].ObjectID {
			t.Fatalf("mutation %d: %s with webhooks, %s without", i, a[i].ObjectID, m.ID)
		}
	}
}

func TestRunSendsWebhooks(t *testing.T) {
	rc := newReceiver(t, nil)
	s := New(Options{Seed: 46, Objects: 10, MutationRate: 500, WebhookURL: rc.srv.URL, WebhookSecret: testSecret})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	rc.waitFor(t, 20)
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	for _, a := range rc.arrivals() {
		if a.header.Get("X-Botix-Signature") != Sign(testSecret, a.body) {
			t.Fatal("bad signature")
		}
	}
}

func TestSign(t *testing.T) {
	// RFC 4231 test case 2: key "Jefe".
	got := Sign("Jefe", []byte("what do ya want for nothing?"))
	if want := "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"; got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
}

func TestValidateWebhookOptions(t *testing.T) {
	for _, o := range []Options{
		{WebhookURL: "localhost:8080/hook"}, {WebhookURL: "ftp://x/"}, {WebhookURL: "http://"},
		{DropRate: -0.1}, {DuplicateRate: 1.1}, {ReorderRate: 2},
		{RetrySchedule: []time.Duration{time.Second, -1}}, {WebhookWorkers: -1},
		{WebhookTimeout: -time.Second}, {TruncateOver: -1},
	} {
		if o.Validate() == nil {
			t.Errorf("Validate(%+v) = nil", o)
		}
	}
	ok := Options{WebhookURL: "https://intake.example/webhooks/botix", DropRate: 1, DuplicateRate: 0.5, RetrySchedule: []time.Duration{}}
	if err := ok.Validate(); err != nil {
		t.Error(err)
	}
}
