package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// The delivery log and the deliveries list filtered by status or by
// target alone read the rows per (target, status) pair and merge them:
// every filter, page and direction gives the rows a plain filter of every
// row would, in the same order.
func TestSelectOutboxMergesPairs(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	rng := rand.New(rand.NewPCG(3, 4))
	targets := []string{"billing", "crm", "discord"}
	statuses := []string{StatusPending, StatusRetrying, StatusDelivered, StatusDeadLetter}
	type info struct{ target, status, eventType string }
	byID := map[int64]info{}
	for i := range 120 {
		tg := targets[rng.IntN(len(targets))]
		et := []string{"payment.succeeded", "contact.created"}[rng.IntN(2)]
		id := enqueue(t, db, tg, fmt.Sprintf("evt_%d", i), et, t0)
		st := statuses[rng.IntN(len(statuses))]
		switch st {
		case StatusRetrying:
			record(t, db, Attempt{DeliveryID: id, Attempt: 1, StatusCode: 503, At: t0}, Outcome{Status: st, NextAttemptAt: t0.Add(time.Hour), Failures: 1})
		case StatusDelivered, StatusDeadLetter:
			record(t, db, Attempt{DeliveryID: id, Attempt: 1, StatusCode: 200, At: t0}, Outcome{Status: st})
		}
		byID[id] = info{tg, st, et}
	}
	ids := slices.Sorted(func(yield func(int64) bool) {
		for id := range byID {
			if !yield(id) {
				return
			}
		}
	})
	want := func(status, target, eventType string, before, after int64, offset, limit int) []int64 {
		var out []int64
		for _, id := range ids {
			in := byID[id]
			if (status == "" || in.status == status) && (target == "" || in.target == target) &&
				(eventType == "" || in.eventType == eventType) && (before == 0 || id < before) && (after == 0 || id > after) {
				out = append(out, id)
			}
		}
		if after == 0 {
			slices.Reverse(out)
		}
		out = out[min(offset, len(out)):]
		out = out[:min(limit, len(out))]
		if after != 0 {
			slices.Reverse(out)
		}
		return out
	}
	idsOf := func(rows []OutboxRow) []int64 {
		out := make([]int64, len(rows))
		for i, r := range rows {
			out[i] = r.ID
		}
		return out
	}
	mid := ids[len(ids)/2]
	for _, status := range append([]string{""}, statuses...) {
		for _, target := range append([]string{"", "nobody"}, targets...) {
			for _, eventType := range []string{"", "contact.created"} {
				name := fmt.Sprintf("status %q target %q type %q", status, target, eventType)
				for _, offset := range []int{0, 7} {
					rows, err := db.Deliveries(ctx, DeliveryFilter{Status: status, Target: target, EventType: eventType, Limit: 9, Offset: offset})
					if err != nil {
						t.Fatal(err)
					}
					if got, w := idsOf(rows), want(status, target, eventType, 0, 0, offset, 9); !slices.Equal(got, w) {
						t.Errorf("Deliveries %s offset %d = %v, want %v", name, offset, got, w)
					}
				}
				for _, page := range []struct{ before, after int64 }{{0, 0}, {mid, 0}, {0, mid}} {
					rows, err := db.DeliveryLog(ctx, LogFilter{Status: status, Target: target, EventType: eventType, Limit: 9,
						Before: page.before, After: page.after})
					if err != nil {
						t.Fatal(err)
					}
					if got, w := idsOf(rows), want(status, target, eventType, page.before, page.after, 0, 9); !slices.Equal(got, w) {
						t.Errorf("DeliveryLog %s before %d after %d = %v, want %v", name, page.before, page.after, got, w)
					}
				}
			}
		}
	}
	if _, err := db.Deliveries(ctx, DeliveryFilter{Status: "lost"}); err == nil || !strings.Contains(err.Error(), "lost") {
		t.Errorf("an unknown status: %v", err)
	}
}

// A selection by status alone or by target alone is split into (target,
// status) pairs, and each pair's query is read through the (target,
// status) index in id order, up to its page's end, never by a scan of the
// table nor a sort of every row of a target: the cost of a page does not
// grow with the outbox.
func TestSelectOutboxPairPlan(t *testing.T) {
	db, _ := openTest(t)
	targets := []string{"billing", "crm"}
	for _, s := range []outboxSelect{
		{status: StatusDeadLetter, limit: 10},
		{status: StatusPending, limit: 10, where: " AND id < ?", args: []any{10}},
		{target: "crm", limit: 10},
		{target: "crm", limit: 10, where: " AND id > ?", args: []any{10}, ascending: true},
		{status: StatusDelivered, eventType: "payment.succeeded", limit: 10, offset: 5},
	} {
		if !s.split() {
			t.Fatalf("%+v is not split into pairs", s)
		}
		parts := s.pairs(targets)
		if len(parts) < 2 {
			t.Fatalf("%+v split into %d pairs", s, len(parts))
		}
		for _, part := range parts {
			q, args, err := part.query()
			if err != nil {
				t.Fatal(err)
			}
			var plan []struct {
				ID, Parent, NotUsed int
				Detail              string
			}
			if err := db.r.Select(&plan, "EXPLAIN QUERY PLAN "+q, args...); err != nil {
				t.Fatal(err)
			}
			var lines []string
			for _, p := range plan {
				lines = append(lines, p.Detail)
			}
			if got := strings.Join(lines, "; "); !strings.Contains(got, "USING INDEX outbox_target_status") || strings.Contains(got, "TEMP B-TREE") {
				t.Errorf("plan of pair %s/%s of %+v: %s; want the (target, status) index, in order", part.target, part.status, s, got)
			}
			if part.offset != 0 || part.limit != s.offset+s.limit {
				t.Errorf("pair %+v reads offset %d limit %d, want its first %d rows", part, part.offset, part.limit, s.offset+s.limit)
			}
		}
	}
	for _, s := range []outboxSelect{{}, {status: StatusDeadLetter, target: "crm"}} {
		if s.split() {
			t.Errorf("%+v is split, want one query", s)
		}
	}
}
