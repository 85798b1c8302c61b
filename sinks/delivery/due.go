package delivery

import (
	"slices"
	"time"
)

// maxDues is the most retry times a worker keeps to wake up at; later ones
// are left to its poll.
const maxDues = 64

// dues are the times a worker's own retries come due, so that it wakes up
// for each rather than only for the earliest and then at its polls. A time
// within slack after one already kept is not kept (its rows are claimed by
// that wake, at most slack late), which bounds the wakes a spread of
// retries makes. The zero value keeps every time.
type dues struct {
	slack time.Duration
	at    []time.Time // earliest first
}

// add keeps t, unless a time kept is within slack after it or maxDues
// earlier ones are kept.
func (d *dues) add(t time.Time) {
	i, _ := slices.BinarySearchFunc(d.at, t, time.Time.Compare)
	if i < len(d.at) && !d.at[i].After(t.Add(d.slack)) {
		return // d.at[i] is in [t, t+slack]
	}
	if i == maxDues {
		return
	}
	if len(d.at) == maxDues {
		d.at = d.at[:maxDues-1]
	}
	d.at = slices.Insert(d.at, i, t)
}

// drop forgets the times not after now: a claim at now takes their rows.
func (d *dues) drop(now time.Time) {
	i, found := slices.BinarySearchFunc(d.at, now, time.Time.Compare)
	if found {
		i++
	}
	d.at = slices.Delete(d.at, 0, i)
}

// next returns the earliest time kept; ok is false when there is none.
func (d *dues) next() (t time.Time, ok bool) {
	if len(d.at) == 0 {
		return time.Time{}, false
	}
	return d.at[0], true
}
