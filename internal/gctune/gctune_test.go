package gctune

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live, roots uint64
		want        int
	}{
		{0, 0, maxPercent},
		{1 * mib, 0, maxPercent},  // 3100% would make the goal Floor; the minimum goal at 800% is Floor already
		{4 * mib, 0, 700},         // 4 + 4 × 7 = 32
		{3 * mib, 1 * mib, 725},   // stacks count: 3 + 4 × 7.25 = 32
		{8 * mib, 0, 300},         // 8 + 8 × 3 = 32
		{16 * mib, 0, minPercent}, // twice the live heap is Floor itself
		{64 * mib, 0, minPercent},
		{4 << 30, 0, minPercent},
	} {
		if got := Percent(c.live, c.roots); got != c.want {
			t.Errorf("Percent(%d MiB live, %d MiB roots) = %d, want %d", c.live>>20, c.roots>>20, got, c.want)
		}
	}
	if maxPercent != 800 {
		t.Errorf("maxPercent = %d, want 800: its minimum goal (4 MiB × GOGC/100) is Floor", maxPercent)
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
	// The goal the runtime computes from it is Floor, not more: it counts
	// the stacks and globals, and never goes under 4 MiB × GOGC/100.
	if g := Goal(); g > Floor*11/10 || g < Floor*9/10 {
		t.Errorf("heap goal %d MiB with GOGC %d, want about Floor (%d MiB)", g>>20, Current(), Floor>>20)
	}

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
