package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	stdsync "sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sinks/intake"
	"github.com/backstop-sync/backstop/store"
)

// BenchmarkIntakeDurable is the intake-durable benchmark, run
// against the real binary: 128 concurrent keep-alive clients post distinct
// signed payment webhooks to `backstop serve` (synchronous=FULL, one
// delivery target subscribed, so each event also gets an outbox row), once
// with group commit (intake.max_batch 512, the default) and once with one
// commit per request (intake.max_batch 1). The two builds alternate over
// five rounds, each on a fresh store and a fresh process. Each figure is
// the median of its five, and the ratio the median of the five rounds'
// own ratios: a round's two runs are seconds apart, so a moment of slow
// fsync or a busy neighbour lands on both sides of it rather than on one
// side of the whole. It prints one BENCH line.
func BenchmarkIntakeDurable(b *testing.B) {
	const clients, rounds = 128, 5
	type figures struct{ perSec, p50, p99, cpu, client, batch []float64 }
	var group, single figures
	var ratios []float64
	add := func(f *figures, r serveRun) {
		f.perSec = append(f.perSec, r.perSec)
		f.p50 = append(f.p50, msOf(r.p50))
		f.p99 = append(f.p99, msOf(r.p99))
		f.cpu = append(f.cpu, r.cpuPerAck)
		f.client = append(f.client, r.clientCPU)
		f.batch = append(f.batch, r.batch)
	}
	for range b.N {
		for round := range rounds {
			g := benchServe(b, fmt.Sprintf("g%d", round), 512, 10000, clients)
			s := benchServe(b, fmt.Sprintf("s%d", round), 1, 1000, clients)
			add(&group, g)
			add(&single, s)
			ratios = append(ratios, g.perSec/s.perSec)
		}
		fmt.Printf("BENCH intake-durable clients=%d acks_per_s=%.0f p50_ms=%.1f p99_ms=%.1f server_cpu_us_per_ack=%.0f client_cpu_us_per_ack=%.0f mean_batch=%.1f per_request_acks_per_s=%.0f per_request_p50_ms=%.1f per_request_p99_ms=%.1f ratio=%.1f ratio_min=%.1f ratio_max=%.1f\n",
			clients, median(group.perSec), median(group.p50), median(group.p99), median(group.cpu), median(group.client), median(group.batch), median(single.perSec), median(single.p50), median(single.p99), median(ratios), slices.Min(ratios), slices.Max(ratios))
	}
}

// serveRun is one run's figures.
type serveRun struct {
	perSec    float64
	p50, p99  time.Duration
	cpuPerAck float64 // the serve process's user+system CPU per ack, µs, startup included
	clientCPU float64 // the load generator's (this process's) CPU per ack while it ran, µs
	batch     float64 // mean webhooks per commit, from serve's /metrics
}

// benchServe starts `backstop serve` on a fresh store with intake.max_batch
// maxBatch, posts n distinct signed webhooks from c concurrent connections,
// stops it with SIGTERM and checks that all n events were stored.
func benchServe(b *testing.B, name string, maxBatch, n, c int) serveRun {
	b.Helper()
	dir := b.TempDir()
	dbPath := filepath.Join(dir, "intake.db")
	// The target is paused before serve starts: its outbox rows are
	// written by every commit, but no delivery competes for the cores.
	db, err := store.Open(context.Background(), dbPath, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	if err := db.PauseTarget(context.Background(), "billing", time.Now().Add(time.Hour)); err != nil {
		b.Fatal(err)
	}
	if err := db.Close(); err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	config := filepath.Join(dir, "schedules.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, `source:
  base_url: http://127.0.0.1:9
  api_key: bench
store:
  path: %s
intake:
  listen: %s
  secret: ${BOTIX_WEBHOOK_SECRET}
  synchronous: FULL
  max_batch: %d
targets:
  - {name: billing, url: "http://127.0.0.1:9/hooks", events: ["payment.*"], allow_private: true}
`, dbPath, addr, maxBatch), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(binPath, "--config", config, "serve")
	cmd.Env = append(os.Environ(), "BOTIX_WEBHOOK_SECRET="+webhookSecret, "BACKSTOP_CONFIG=")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	if err := waitReady("http://" + addr + "/readyz"); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		b.Fatalf("%v\n%s", err, stderr.String())
	}

	// Requests are built and signed before the clock starts: the load
	// generator shares the server's two cores, and signing is the
	// sender's work. Each client is a plain keep-alive HTTP/1.1
	// connection writing prepared requests and reading just the status
	// and the Content-Length-framed body of each answer (as wrk does);
	// net/http's Transport would take as much CPU as the server, and its
	// ReadResponse a quarter of that.
	reqs := make([][]byte, n)
	for i := range reqs {
		ts := time.Date(2026, 3, 1, 10, 0, 0, i*1000, time.UTC).Format(time.RFC3339Nano)
		body := fmt.Appendf(nil, `{"event_id":"evt_%s_%d","event":"payment.succeeded","created_at":%q,"data":{"id":"pay_%d","contact_id":"ct_1","amount":1250,"currency":"EUR","status":"succeeded","created_at":"2026-01-01T00:00:00Z","updated_at":%q}}`,
			name, i, ts, i, ts)
		reqs[i] = fmt.Appendf(nil, "POST /webhooks/botix HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nX-Botix-Signature: %s\r\nContent-Length: %d\r\n\r\n%s",
			intake.SignBotix(webhookSecret, body), len(body), body)
	}
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var wg stdsync.WaitGroup
	errs := make(chan error, c)
	cpu0, start := processCPU(), time.Now()
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
				status, err := readStatus(br)
				if err != nil {
					errs <- fmt.Errorf("webhook %d: %w", i, err)
					return
				}
				lat[i] = time.Since(t0)
				if status != http.StatusOK {
					errs <- fmt.Errorf("webhook %d: status %d", i, status)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	clientCPU := processCPU() - cpu0
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}

	batch, err := meanBatch("http://" + addr + "/metrics")
	if err != nil {
		b.Fatal(err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		b.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		b.Fatalf("serve after SIGTERM: %v\n%s", err, stderr.String())
	}
	cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	db, err = store.Open(context.Background(), dbPath, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	if got, err := db.CountProcessed(context.Background()); err != nil || got != n {
		b.Fatalf("%d events stored (%v), want %d", got, err, n)
	}
	slices.Sort(lat)
	return serveRun{
		perSec:    float64(n) / elapsed.Seconds(),
		p50:       lat[n/2],
		p99:       lat[n*99/100],
		cpuPerAck: float64(cpu.Microseconds()) / float64(n),
		clientCPU: float64(clientCPU.Microseconds()) / float64(n),
		batch:     batch,
	}
}

// readStatus reads one HTTP/1.1 response from br, as serve frames its
// answers (a Content-Length, no chunking), and returns its status code
// with the body discarded.
func readStatus(br *bufio.Reader) (int, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	// "HTTP/1.1 200 OK\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, fmt.Errorf("not an HTTP/1.x status line: %q", line)
	}
	status, ok := digits(line[9:12])
	if !ok {
		return 0, fmt.Errorf("bad status line %q", line)
	}
	length := -1
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		if bytes.EqualFold(name, []byte("Content-Length")) {
			n, ok := digits(bytes.TrimSpace(value))
			if !ok {
				return 0, fmt.Errorf("bad Content-Length %q", value)
			}
			length = n
		}
	}
	if length < 0 {
		return 0, fmt.Errorf("answer %d has no Content-Length", status)
	}
	if _, err := br.Discard(length); err != nil {
		return 0, err
	}
	return status, nil
}

// digits parses b, decimal digits only.
func digits(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 9 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// meanBatch reads the mean commit batch size from serve's /metrics.
func meanBatch(url string) (float64, error) {
	res, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	var sum, count float64
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		name, value, _ := strings.Cut(sc.Text(), " ")
		switch name {
		case "backstop_emit_commit_batch_size_sum":
			fmt.Sscan(value, &sum)
		case "backstop_emit_commit_batch_size_count":
			fmt.Sscan(value, &count)
		}
	}
	if count == 0 {
		return 0, fmt.Errorf("no commits in %s", url)
	}
	return sum / count, sc.Err()
}

// waitReady polls url until it answers 200, or fails after 30 s.
func waitReady(url string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := http.Get(url)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %d", res.StatusCode)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("serve not ready after 30 s: %w", err)
		}
		time.Sleep(20 * time.Millisecond) // polling a process we do not control, bounded by the deadline
	}
}

// median returns the middle value of xs (sorted in place).
func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
