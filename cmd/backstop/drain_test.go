package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"
)

// keepAlive is one client connection to serve, kept open between requests.
type keepAlive struct {
	t    *testing.T
	conn net.Conn
	br   *bufio.Reader
}

func dialServe(t *testing.T, addr string) *keepAlive {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(time.Minute))
	return &keepAlive{t: t, conn: conn, br: bufio.NewReader(conn)}
}

// get sends GET path and reads the JSON answer.
func (k *keepAlive) get(path string) (*http.Response, map[string]any) {
	k.t.Helper()
	fmt.Fprintf(k.conn, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
	return readJSONAnswer(k.t, k.br)
}

// SIGTERM: serve stops accepting connections, but for a short while keeps
// those already open, answering a new request on one of them 503 JSON with
// Retry-After and Connection: close (/readyz says "draining", so a load
// balancer can tell); a webhook already in flight is still committed and
// answered 200; then serve exits 0.
func TestServeDrainsOpenConnectionsOnSIGTERM(t *testing.T) {
	// A drain longer than the test's steps take on a loaded machine; it
	// ends early once the test has closed its connections.
	s := startServe(t, "BACKSTOP_DRAIN_PERIOD=30s")

	ready := dialServe(t, s.addr) // a load balancer's health checks
	if res, v := ready.get("/readyz"); res.StatusCode != 200 || v["status"] != "ready" {
		t.Fatalf("/readyz before SIGTERM: %d %v", res.StatusCode, v)
	}
	idle := dialServe(t, s.addr) // a sender's keep-alive connection
	if res, _ := idle.get("/healthz"); res.StatusCode != 200 {
		t.Fatalf("/healthz: %d", res.StatusCode)
	}
	proxy := dialServe(t, s.addr) // an internal service's, for /outbox
	if res, _ := proxy.get("/healthz"); res.StatusCode != 200 {
		t.Fatalf("/healthz: %d", res.StatusCode)
	}
	// A webhook in flight: serve has asked for its body (100 Continue), so
	// it is past the door, and has half of it when SIGTERM comes.
	inFlight := dialServe(t, s.addr)
	body := paymentWebhook("evt_in_flight", "pay_in_flight")
	fmt.Fprint(inFlight.conn, webhookHead(body)+"Expect: 100-continue\r\n\r\n")
	if res, err := http.ReadResponse(inFlight.br, nil); err != nil || res.StatusCode != http.StatusContinue {
		t.Fatalf("want 100 Continue, got %v %v", res, err)
	}
	inFlight.conn.Write(body[:len(body)/2])

	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}

	// /readyz turns to 503 draining on the connection that was open.
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, v := ready.get("/readyz")
		if res.StatusCode == http.StatusServiceUnavailable {
			if v["status"] != "draining" || res.Header.Get("Retry-After") == "" || !res.Close {
				t.Errorf("/readyz while draining: %v, Retry-After %q, Connection: close %v", v, res.Header.Get("Retry-After"), res.Close)
			}
			break
		}
		if res.StatusCode != 200 || time.Now().After(deadline) {
			t.Fatalf("/readyz after SIGTERM: %d %v", res.StatusCode, v)
		}
		time.Sleep(10 * time.Millisecond) // polling serve, with a deadline
	}
	// No new connection is accepted.
	if c, err := net.DialTimeout("tcp", s.addr, 5*time.Second); err == nil {
		c.Close()
		t.Error("serve accepted a new connection while draining")
	}
	// A new webhook on the open connection: 503, to be retried.
	refused := paymentWebhook("evt_refused", "pay_refused")
	fmt.Fprint(idle.conn, webhookHead(refused)+"\r\n"+string(refused))
	if res, v := readJSONAnswer(t, idle.br); res.StatusCode != http.StatusServiceUnavailable || errorCode(v) != "draining" ||
		res.Header.Get("Retry-After") == "" || !res.Close {
		t.Errorf("webhook while draining: %d %v, Retry-After %q, Connection: close %v; want 503 draining, Retry-After, close",
			res.StatusCode, v, res.Header.Get("Retry-After"), res.Close)
	}
	// So is a payload for the outbox (webhook-proxy mode).
	payload := `{"hello":"world"}`
	fmt.Fprintf(proxy.conn, "POST /outbox/billing HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nX-Event-Id: evt_proxy\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", proxyToken, len(payload), payload)
	if res, v := readJSONAnswer(t, proxy.br); res.StatusCode != http.StatusServiceUnavailable || errorCode(v) != "draining" ||
		res.Header.Get("Retry-After") == "" || !res.Close {
		t.Errorf("POST /outbox/billing while draining: %d %v, Retry-After %q, Connection: close %v; want 503 draining, Retry-After, close",
			res.StatusCode, v, res.Header.Get("Retry-After"), res.Close)
	}
	// The webhook in flight is finished: committed, then answered.
	inFlight.conn.Write(body[len(body)/2:])
	if res, v := readJSONAnswer(t, inFlight.br); res.StatusCode != 200 || v["status"] != "accepted" {
		t.Errorf("webhook in flight at SIGTERM: %d %v, want 200 accepted", res.StatusCode, v)
	}

	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait() }()
	select {
	case <-exited:
	case <-time.After(60 * time.Second): // the drain ends once the connections above have closed
		t.Fatal("serve did not exit within 60 s of SIGTERM")
	}
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("serve exit %d after SIGTERM, want 0", code)
	}
	db := s.e.openStore()
	defer db.Close()
	ctx := context.Background()
	if _, ok, err := db.ProcessedEvent(ctx, "evt_in_flight"); err != nil || !ok {
		t.Errorf("the webhook in flight was answered but not stored (%v)", err)
	}
	if _, ok, err := db.ProcessedEvent(ctx, "evt_refused"); err != nil || ok {
		t.Errorf("the webhook refused while draining was stored (%v)", err)
	}
	rows, err := db.OutboxRows(ctx, "billing")
	if err != nil {
		t.Fatal(err)
	}
	// The webhook in flight queued the one row; the proxy's payload none.
	var ids []string
	for _, r := range rows {
		ids = append(ids, r.EventID)
	}
	if len(ids) != 1 || ids[0] != "evt_in_flight" {
		t.Errorf("billing's queue holds %v, want only evt_in_flight: the payload refused while draining was queued", ids)
	}
}

// A keep-alive connection that stays idle does not hold serve past its
// short drain: SIGTERM to exit 0 takes seconds, and the connection is
// closed without an answer it did not ask for.
func TestServeDrainIsBounded(t *testing.T) {
	s := startServe(t)
	idle := dialServe(t, s.addr)
	if res, _ := idle.get("/healthz"); res.StatusCode != 200 {
		t.Fatalf("/healthz: %d", res.StatusCode)
	}
	start := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait() }()
	select {
	case <-exited:
	case <-time.After(20 * time.Second): // the drain is 2 s; IdleTimeout, 90 s
		t.Fatal("serve did not exit within 20 s of SIGTERM with an idle connection open")
	}
	t.Logf("exit %d after %s", s.cmd.ProcessState.ExitCode(), time.Since(start))
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("serve exit %d after SIGTERM, want 0", code)
	}
	if b, err := idle.br.ReadByte(); err == nil {
		t.Errorf("the idle connection got %q, want it closed", b)
	}
}
