package delivery

import (
	"slices"
	"testing"
	"time"
)

func TestDues(t *testing.T) {
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(ms ...int) []time.Time {
		out := make([]time.Time, len(ms))
		for i, m := range ms {
			out[i] = base.Add(time.Duration(m) * time.Millisecond)
		}
		return out
	}
	tests := []struct {
		name  string
		slack time.Duration
		add   []int // ms after base, in order
		drop  int   // ms after base; -1: no drop
		want  []int
	}{
		{"kept in order", 0, []int{30, 10, 20}, -1, []int{10, 20, 30}},
		{"the same time once", 0, []int{10, 10}, -1, []int{10}},
		{"a time within slack before one kept is not kept", 5 * time.Millisecond, []int{20, 16}, -1, []int{20}},
		{"a time within slack after one kept is kept", 5 * time.Millisecond, []int{16, 20}, -1, []int{16, 20}},
		{"a time more than slack before one kept is kept", 5 * time.Millisecond, []int{20, 14}, -1, []int{14, 20}},
		{"drop forgets times up to now", 0, []int{10, 20, 30}, 20, []int{30}},
		{"drop between times", 0, []int{10, 20, 30}, 15, []int{20, 30}},
		{"drop before every time", 0, []int{10, 20}, 5, []int{10, 20}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := dues{slack: tt.slack}
			for _, m := range tt.add {
				d.add(at(m)[0])
			}
			if tt.drop >= 0 {
				d.drop(at(tt.drop)[0])
			}
			if want := at(tt.want...); !slices.Equal(d.at, want) {
				t.Errorf("times = %v, want %v", d.at, want)
			}
			next, ok := d.next()
			if ok != (len(tt.want) > 0) || (ok && !next.Equal(at(tt.want[0])[0])) {
				t.Errorf("next = %v, %v; want the earliest of %v", next, ok, tt.want)
			}
		})
	}
}

func TestDuesKeepsTheEarliest(t *testing.T) {
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var d dues
	for i := maxDues + 10; i > 0; i-- {
		d.add(base.Add(time.Duration(i) * time.Second))
	}
	if len(d.at) != maxDues {
		t.Fatalf("kept %d times, want %d", len(d.at), maxDues)
	}
	if first, last := d.at[0], d.at[maxDues-1]; !first.Equal(base.Add(time.Second)) || !last.Equal(base.Add(maxDues*time.Second)) {
		t.Errorf("kept %v..%v, want the earliest %d", first, last, maxDues)
	}
	d.add(base.Add(time.Hour)) // later than every time kept, with none to spare
	if last := d.at[len(d.at)-1]; !last.Equal(base.Add(maxDues * time.Second)) {
		t.Errorf("a later time replaced %v", last)
	}
}
