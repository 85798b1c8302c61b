package intake_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
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

func BenchmarkTmpObs(b *testing.B) {
	n, c := 20000, 128
	db, _ := store.Open(context.Background(), filepath.Join(b.TempDir(), "bench.db"), store.Options{Synchronous: "FULL"})
	defer db.Close()
	v, _ := intake.NewVerifier("botix", intake.SchemeOptions{Secrets: []string{secret}})
	routes := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}
	var mu stdsync.Mutex
	var sizes []int
	var tooks []time.Duration
	w := intake.NewBatcher(db, intake.BatcherOptions{Routes: routes, Observe: func(s int, t time.Duration, err error) {
		mu.Lock(); sizes = append(sizes, s); tooks = append(tooks, t); mu.Unlock()
	}})
	done := make(chan struct{})
	go func() { defer close(done); w.Run(context.Background()) }()
	srv := httptest.NewServer(intake.NewHandler(v, w, intake.HandlerOptions{}))
	defer func() { srv.Close(); w.Close(context.Background()); <-done }()
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = paymentEvent(fmt.Sprintf("evt_o_%d", i), fmt.Sprintf("pay_%d", i),
			time.Date(2026, 3, 1, 10, 0, 0, i*1000, time.UTC).Format(time.RFC3339Nano), "succeeded")
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c, MaxConnsPerHost: c}}
	var next atomic.Int64
	var wg stdsync.WaitGroup
	start := time.Now()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(bodies[i]))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Botix-Signature", intake.SignBotix(secret, bodies[i]))
				res, err := client.Do(req)
				if err != nil {
					panic(err)
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	var tot time.Duration
	for _, t := range tooks {
		tot += t
	}
	ss := slices.Clone(sizes); slices.Sort(ss)
	st := slices.Clone(tooks); slices.Sort(st)
	fmt.Printf("OBS rate=%.0f batches=%d meanbatch=%.1f p50batch=%d commit_total=%v (%.0f%% of wall) p50took=%v p99took=%v max=%v\n",
		float64(n)/el.Seconds(), len(sizes), float64(n)/float64(len(sizes)), ss[len(ss)/2], tot, 100*tot.Seconds()/el.Seconds(), st[len(st)/2], st[len(st)*99/100], st[len(st)-1])
}
