package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/internal/syncbuf"
	"github.com/backstop-sync/backstop/sources/sim"
)

// TestServeGivesUpATruncatedEventFromTheFuture: serve took a truncated
// webhook whose created_at was a year ahead (the platform's clock) and
// whose payment the platform did not have; the 404 was to be retried until
// an hour after created_at, so for a year, the event pending all along. It
// is given up an hour after it arrived.
func TestServeGivesUpATruncatedEventFromTheFuture(t *testing.T) {
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 21, Objects: 20}})
	e.writeServeConfig(addr, "")
	serveInProcess(t, e, addr)
	ahead := time.Now().AddDate(1, 0, 0).UTC().Format(time.RFC3339)
	body := fmt.Appendf(nil, `{"event_id":"evt_ahead","event":"payment.succeeded","created_at":%q,"truncated":true,"data":{"id":"pay_doesnotexist"}}`, ahead)
	if code, answer := postSigned(t, "http://"+addr+"/webhooks/botix", webhookSecret, body); code != http.StatusOK {
		t.Fatalf("truncated webhook: %d %s", code, answer)
	}
	// It arrived two hours ago: past the grace, whatever its created_at says.
	raw, err := sql.Open("sqlite", e.db+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Exec(`UPDATE processed_events SET received_at = ? WHERE event_id = 'evt_ahead'`,
		backstop.CanonicalTime(time.Now().Add(-2*time.Hour))); err != nil {
		t.Fatal(err)
	}
	metrics := func() string {
		res, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return ""
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}
	// The first retries come 1 s, then 2 s after the first fetch.
	waitFor(t, 30*time.Second, func() bool {
		return strings.Contains(metrics(), `backstop_truncated_fetches_total{result="gave_up"} 1`+"\n")
	})
	db := e.openStore()
	defer db.Close()
	pe, ok, err := db.ProcessedEvent(context.Background(), "evt_ahead")
	if err != nil || !ok || pe.Truncated || !strings.HasPrefix(pe.LastFetchError, "given up") {
		t.Errorf("evt_ahead after serve gave it up: %+v %v %v", pe, ok, err)
	}
	waitFor(t, 30*time.Second, func() bool { return strings.Contains(metrics(), "backstop_truncated_pending 0\n") })
}

// TestSimAndDemoRefuseBadRatesAndCounts: "backstop sim --drop-rate
// NaN" (or --error-rate, --mutation-rate NaN, --mutation-rate Inf) used to
// start and serve, losing no webhook, injecting no error, making no change;
// "backstop demo --rate NaN" ran, made no change, and said "mirror matches
// platform: yes". A rate of 1e9 changes a second ran away (one tick's
// changes took minutes and Ctrl-C did not end them), and ten million
// objects per resource filled the memory before serving. Each is refused
// (exit 2) naming its flag.
func TestSimAndDemoRefuseBadRatesAndCounts(t *testing.T) {
	for _, args := range [][]string{
		{"sim", "--drop-rate", "NaN"}, {"sim", "--error-rate", "nan"},
		{"sim", "--mutation-rate", "NaN"}, {"sim", "--mutation-rate", "Inf"},
		{"sim", "--mutation-rate", "1e9"}, {"sim", "--objects", "10000000"},
		{"demo", "--rate", "NaN"}, {"demo", "--rate", "+Inf"},
		{"demo", "--rate", "1e9"}, {"demo", "--objects", "10000000"},
	} {
		run := append([]string(nil), args...)
		if args[0] == "sim" {
			run = append(run, "--listen", "127.0.0.1:0")
		} else {
			run = append(run, "--duration", "1s")
			if args[1] != "--objects" {
				run = append(run, "--objects", "10")
			}
		}
		// The old binary served these (or ran the demo): 20 s is ample to refuse them.
		code, stdout, stderr := runBinaryFor(t, 20*time.Second, t.TempDir(), nil, run...)
		if code != exitUsage || !strings.Contains(stderr, args[1]+" ") {
			t.Errorf("%v: exit %d, want 2 with a message naming %s\n%s%s", args, code, args[1], stdout, stderr)
		}
	}
}

// TestSimRefusesWebhookFlagsThatWouldSendNothing: "backstop sim
// --mutation-rate 5 --drop-rate 0.1" (no --webhook-url) used to serve and
// send no webhook at all, its drop rate ignored, and "backstop sim
// --webhook-url URL" without --mutation-rate made no change, so sent no
// webhook either. Both are refused (exit 2) saying which flag is missing;
// the README's example, with both, still runs.
func TestSimRefusesWebhookFlagsThatWouldSendNothing(t *testing.T) {
	for _, c := range []struct {
		args       []string
		flag, want string // the flag refused, the flag missing
	}{
		{[]string{"--mutation-rate", "5", "--drop-rate", "0.1"}, "--drop-rate", "--webhook-url"},
		{[]string{"--mutation-rate", "5", "--retry-schedule", "1s"}, "--retry-schedule", "--webhook-url"},
		{[]string{"--webhook-url", "http://127.0.0.1:1/webhooks/botix", "--webhook-secret", "s"}, "--webhook-url", "--mutation-rate"},
	} {
		// The old binary served these: 20 s is ample to refuse them.
		code, stdout, stderr := runBinaryFor(t, 20*time.Second, t.TempDir(), nil, append([]string{"sim", "--listen", "127.0.0.1:0"}, c.args...)...)
		if code != exitUsage || !strings.Contains(stderr, c.flag) || !strings.Contains(stderr, c.want) {
			t.Errorf("sim %v: exit %d, want 2 naming %s and %s\n%s%s", c.args, code, c.flag, c.want, stdout, stderr)
		}
	}
	startSim(t, "--mutation-rate", "20", "--drop-rate", "0.1", "--duplicate-rate", "0.05",
		"--webhook-url", "http://127.0.0.1:1/webhooks/botix", "--webhook-secret", "s")
}

// TestSimWarnsOfWebhooksNotAccepted: "backstop sim --webhook-url" with a
// mistyped URL (or a secret serve does not share) said nothing at all,
// not even at debug level, and its stop line counted no webhooks, so it
// looked like no traffic. It now warns of the first attempt not answered
// 2xx at once, naming the URL and the error (then at most once per 10 s,
// with how many failed), and its stop line counts the webhooks.
func TestSimWarnsOfWebhooksNotAccepted(t *testing.T) {
	closed := freeAddr(t) // nothing listens there
	cmd := exec.Command(binPath, "sim", "--listen", "127.0.0.1:0", "--mutation-rate", "20",
		"--webhook-url", "http://"+closed+"/webhooks/botix", "--webhook-secret", "s")
	cmd.Env = append(os.Environ(), "BACKSTOP_CONFIG=")
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	waitFor(t, 20*time.Second, func() bool { return strings.Contains(stderr.String(), "webhook not accepted") })
	line := stderr.String()
	if !strings.Contains(line, "url=http://"+closed+"/webhooks/botix") || !strings.Contains(line, "connection refused") {
		t.Errorf("warning names neither the URL nor the error:\n%s", line)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("sim after SIGTERM: %v\n%s", err, stderr.String())
	}
	out := stderr.String()
	// Every attempt failed (20 a second): one line per 10 s at most.
	if n, most := strings.Count(out, "webhook not accepted"), 1+int(time.Since(start)/sim.WebhookWarnEvery); n > most {
		t.Errorf("%d warnings in %v, want at most %d:\n%s", n, time.Since(start), most, out)
	}
	if !strings.Contains(out, "simulator stopped") || !strings.Contains(out, "webhooks_delivered=0") || strings.Contains(out, "webhook_attempts=0 ") {
		t.Errorf("stop line without the webhook counts:\n%s", out)
	}
}
