// Package gctune sets the Go garbage collector's pace for backstop's
// processes.
//
// backstop's live heap is small: 2 to 3 MiB while serve acknowledges
// 20,000 webhooks a second or delivers 25,000 events a second. At Go's
// default (GOGC=100, a heap goal of twice the live heap, 4 MiB at least)
// the collector then runs every 10 to 20 ms, and its fixed cost per cycle
// (scanning a few hundred goroutine stacks, the write barrier while it
// marks) took about a tenth of the CPU on 2 cores. Start lets the heap
// grow to Floor before a cycle while the live heap is small, and keeps
// Go's default once that is the larger goal. GOGC set in the environment
// wins.
package gctune

import (
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// Floor is the heap goal while the live heap is small.
const Floor = 32 << 20

// Percents bound the GOGC that Start sets: Go's default at least, and at
// most the one whose minimum goal is Floor. The runtime's goal is the
// live heap plus GOGC% of the live heap, the goroutine stacks and the
// globals, and never under 4 MiB × GOGC/100: beyond maxPercent that
// minimum alone would pass Floor.
const (
	minPercent = 100
	maxPercent = Floor / (4 << 20) * 100
)

// The runtime's figures Start reads: the heap the last cycle found live,
// the stacks and globals it scanned, and the GOGC in force.
const (
	liveMetric    = "/gc/heap/live:bytes"
	stacksMetric  = "/gc/scan/stack:bytes"
	globalsMetric = "/gc/scan/globals:bytes"
	percentMetric = "/gc/gogc:percent"
)

var (
	mu      sync.Mutex
	started bool
)

// Start paces the collector as the package comment says, from now on:
// after each cycle it sets GOGC from the live heap that cycle found. It
// returns false, changing nothing, when GOGC is set in the environment.
// Calls after the first do nothing more.
func Start() bool {
	if os.Getenv("GOGC") != "" {
		return false
	}
	mu.Lock()
	defer mu.Unlock()
	if !started {
		started = true
		tuneLocked()
		arm()
	}
	return true
}

// sentinel is allocated for the next cycle to find unreachable: its
// cleanup runs after that cycle. It holds a pointer so that it is not a
// tiny allocation, which may share a block with live objects and never
// be found unreachable.
type sentinel struct {
	_ *int
	_ [8]byte
}

// arm sets the pace again after the next cycle, and arms itself again.
func arm() {
	runtime.AddCleanup(&sentinel{}, func(struct{}) {
		mu.Lock()
		tuneLocked()
		mu.Unlock()
		arm()
	}, struct{}{})
}

// tuneLocked sets GOGC from the last cycle's figures when it differs from
// the one in force; mu is held.
func tuneLocked() {
	s := []metrics.Sample{{Name: liveMetric}, {Name: stacksMetric}, {Name: globalsMetric}, {Name: percentMetric}}
	metrics.Read(s)
	for _, m := range s {
		if m.Value.Kind() != metrics.KindUint64 {
			return
		}
	}
	p := Percent(s[0].Value.Uint64(), s[1].Value.Uint64()+s[2].Value.Uint64())
	if uint64(p) != s[3].Value.Uint64() {
		debug.SetGCPercent(p)
	}
}

// Percent is the GOGC that makes the heap goal Floor, or Go's default once
// that is larger, for a live heap of live bytes and roots (goroutine
// stacks and globals) of roots bytes: the runtime's goal is live + (live +
// roots) × GOGC/100.
func Percent(live, roots uint64) int {
	if live+roots == 0 {
		return maxPercent
	}
	p := (float64(Floor) - float64(live)) / float64(live+roots) * 100
	return int(math.Round(min(max(p, minPercent), maxPercent)))
}

// Goal is the heap goal in force, as the runtime computes it.
func Goal() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// Current is the GOGC in force.
func Current() int {
	s := []metrics.Sample{{Name: percentMetric}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return -1
	}
	return int(s[0].Value.Uint64())
}
