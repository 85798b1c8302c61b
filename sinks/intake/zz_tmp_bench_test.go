package intake_test

import (
	"fmt"
	"os"
	"strconv"
	"testing"
)

func BenchmarkTmpGroup(b *testing.B) {
	mb, _ := strconv.Atoi(os.Getenv("MB"))
	n := 20000
	if mb == 1 {
		n = 2000
	}
	for range b.N {
		r, p50, p99 := benchRun(b, mb, n, 128)
		fmt.Printf("TMP mb=%d acks_per_s=%.0f p50=%.1f p99=%.1f\n", mb, r, ms(p50), ms(p99))
	}
}
