package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// Concurrent writers lose nothing, and reading while they write is safe
// (go test -race).
func TestConcurrentWritesAllLand(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				b.Write([]byte("x\n"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if n := strings.Count(b.String(), "x\n"); n != 800 {
		t.Errorf("%d writes landed, want 800", n)
	}
}
