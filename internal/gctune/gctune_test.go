package gctune

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	for _, c := range []struct {
		live uint64
		want int
	}{
		{0, maxPercent},
		{1 << 20, maxPercent}, // goal 32 MiB would take 3100%
		{2 << 20, 1500},       // 2 MiB live: goal 32 MiB
		{8 << 20, 300},
		{16 << 20, minPercent}, // twice the live heap is the floor itself
		{64 << 20, minPercent},
		{4 << 30, minPercent},
	} {
		if got := Percent(c.live); got != c.want {
			t.Errorf("Percent(%d MiB) = %d, want %d", c.live>>20, got, c.want)
		}
	}
}

// With GOGC unset, Start raises GOGC for this test's small heap after a
// cycle, and keeps setting it after the cycles that follow: a heap grown
// past the floor gets Go's default back. With GOGC set, it changes nothing.
func TestStart(t *testing.T) {
	t.Setenv("GOGC", "50")
	if Start() {
		t.Fatal("Start with GOGC set in the environment tuned the collector")
	}
	t.Setenv("GOGC", "")
	defer debug.SetGCPercent(100)
	if !Start() {
		t.Fatal("Start with GOGC unset did not tune the collector")
	}
	// waitFor runs cycles until GOGC satisfies ok.
	waitFor := func(what string, ok func(int) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok(Current()) {
			if time.Now().After(deadline) {
				t.Fatalf("GOGC is %d after 10 s of cycles, want %s", Current(), what)
			}
			runtime.GC()
			time.Sleep(time.Millisecond) // the cleanup runs on its own goroutine
		}
	}
	waitFor("over 500 for a heap of a few MiB", func(p int) bool { return p > 500 })

	big := make([][]byte, 48) // 48 MiB live: over the floor
	for i := range big {
		big[i] = make([]byte, 1<<20)
		big[i][0] = 1
	}
	waitFor("100 with 48 MiB live", func(p int) bool { return p == minPercent })
	runtime.KeepAlive(big)
	big = nil
	waitFor("over 500 once the heap is small again", func(p int) bool { return p > 500 })
}
