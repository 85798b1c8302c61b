package intake_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	stdsync "sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sinks/intake"
	"github.com/backstop-sync/backstop/store"
)

// benchRun posts n distinct signed webhooks from c concurrent clients to a
// real HTTP server running the intake handler over a synchronous=FULL store,
// and returns acks/s and the latency percentiles.
func benchRun(b *testing.B, maxBatch, n, c int) (perSec float64, p50, p99 time.Duration) {
	b.Helper()
	db, err := store.Open(context.Background(), filepath.Join(b.TempDir(), "bench.db"), store.Options{Synchronous: "FULL"})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	v, err := intake.NewVerifier("botix", intake.SchemeOptions{Secrets: []string{secret}})
	if err != nil {
		b.Fatal(err)
	}
	routes := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}
	w := intake.NewBatcher(db, intake.BatcherOptions{MaxBatch: maxBatch, Routes: routes})
	done := make(chan struct{})
	go func() { defer close(done); w.Run(context.Background()) }()
	srv := httptest.NewServer(intake.NewHandler(v, w, intake.HandlerOptions{}))
	defer func() { srv.Close(); w.Close(context.Background()); <-done }()

	// Bodies are built and signed before the clock starts: the load
	// generator shares the server's cores, and signing is the sender's work.
	bodies := make([][]byte, n)
	sigs := make([]string, n)
	for i := range bodies {
		bodies[i] = paymentEvent(fmt.Sprintf("evt_b%d_%d", maxBatch, i), fmt.Sprintf("pay_%d", i),
			time.Date(2026, 3, 1, 10, 0, 0, i*1000, time.UTC).Format(time.RFC3339Nano), "succeeded")
		sigs[i] = intake.SignBotix(secret, bodies[i])
	}
	// The load generator is a plain keep-alive HTTP/1.1 client, one
	// connection per concurrent sender, writing requests prepared before the
	// clock starts (as wrk does): net/http's Transport would spend as much
	// CPU as the server on these two shared cores and measure itself.
	reqs := make([][]byte, n)
	for i := range reqs {
		reqs[i] = fmt.Appendf(nil, "POST / HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nX-Botix-Signature: %s\r\nContent-Length: %d\r\n\r\n%s",
			sigs[i], len(bodies[i]), bodies[i])
	}
	addr := srv.Listener.Addr().String()
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var wg stdsync.WaitGroup
	errs := make(chan error, c)
	start := time.Now()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			br := bufio.NewReader(conn)
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				t0 := time.Now()
				if _, err := conn.Write(reqs[i]); err != nil {
					errs <- err
					return
				}
				res, err := http.ReadResponse(br, nil)
				if err != nil {
					errs <- err
					return
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				lat[i] = time.Since(t0)
				if res.StatusCode != 200 {
					errs <- fmt.Errorf("status %d", res.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	if got, _ := db.CountProcessed(context.Background()); got != n {
		b.Fatalf("%d events stored, want %d", got, n)
	}
	slices.Sort(lat)
	return float64(n) / elapsed.Seconds(), lat[n/2], lat[n*99/100]
}

// BenchmarkIntakeDurable: concurrent signed webhooks, synchronous=FULL, with
// group commit and with one commit per request, in the same run. The two
// builds alternate over three rounds and each figure is the median of its
// three, so that a moment of slow fsync or a busy neighbour does not land
// on one side only.
func BenchmarkIntakeDurable(b *testing.B) {
	const clients, rounds = 128, 3
	type figures struct{ perSec, p50, p99 []float64 }
	var group, single figures
	add := func(f *figures, perSec float64, p50, p99 time.Duration) {
		f.perSec = append(f.perSec, perSec)
		f.p50 = append(f.p50, ms(p50))
		f.p99 = append(f.p99, ms(p99))
	}
	for range b.N {
		for range rounds {
			perSec, p50, p99 := benchRun(b, 0, 10000, clients)
			add(&group, perSec, p50, p99)
			perSec, p50, p99 = benchRun(b, 1, 1000, clients)
			add(&single, perSec, p50, p99)
		}
		g, s := median(group.perSec), median(single.perSec)
		fmt.Printf("BENCH intake-durable clients=%d acks_per_s=%.0f p50_ms=%.1f p99_ms=%.1f per_request_acks_per_s=%.0f per_request_p50_ms=%.1f per_request_p99_ms=%.1f ratio=%.1f\n",
			clients, g, median(group.p50), median(group.p99), s, median(single.p50), median(single.p99), g/s)
	}
}

// median returns the middle value of xs (sorted in place).
func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
