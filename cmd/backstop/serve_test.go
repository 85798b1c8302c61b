package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sinks/intake"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

const webhookSecret = "whsec-test-secret-for-serve"

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// newServeEnv is an env whose config also has an intake on addr.
func newServeEnv(t *testing.T, addr string, o envOpts) *env {
	t.Helper()
	e := newEnv(t, o)
	e.writeConfig(fmt.Sprintf(`source:
  base_url: %s
  api_key: ${BOTIX_API_KEY}
  page_size: 50
store:
  path: %s
intake:
  listen: %s
  secret: ${BOTIX_WEBHOOK_SECRET}
targets:
  - {name: billing, url: "http://127.0.0.1:9/hooks", events: ["payment.*"], allow_private: true}
`, e.srv.URL, e.db, addr))
	return e
}

// writeServeConfig writes a configuration for serve with its intake on
// addr: the platform and store as newEnv has them, the webhook secret from
// BOTIX_WEBHOOK_SECRET, and then extra (more top-level YAML: targets,
// dashboard, ...; indented lines first go on under intake).
func (e *env) writeServeConfig(addr, extra string) {
	e.t.Helper()
	e.writeConfig(fmt.Sprintf(`source:
  base_url: %s
  api_key: ${BOTIX_API_KEY}
store:
  path: %s
intake:
  listen: %s
  secret: ${BOTIX_WEBHOOK_SECRET}
`, e.srv.URL, e.db, addr) + extra)
}

// While the sim sends 2,000 webhooks as fast as it can, serve is SIGKILLed
// and restarted; once the sim's retries are over, every event that was ever
// answered 2xx is stored.
func TestServeKilledMidStreamLosesNoAcknowledgedEvent(t *testing.T) {
	addr := freeAddr(t)
	e := newServeEnv(t, addr, envOpts{sim: sim.Options{
		Seed: 17, Objects: 300,
		WebhookURL: "http://" + addr + "/webhooks/botix", WebhookSecret: webhookSecret,
		WebhookWorkers: 16, DuplicateRate: 0.05,
		RetrySchedule: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond,
			400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond, 3200 * time.Millisecond},
	}})
	env := append(e.environ(e.sim.APIKey()), "BOTIX_WEBHOOK_SECRET="+webhookSecret)

	start := func() (*procHandle, <-chan string) {
		cmd, lines := e.startBinaryEnv(env, "serve")
		waitLines(t, lines, "serving", 1, 30*time.Second)
		return cmd, lines
	}
	first, _ := start()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.sim.StartWebhooks(ctx)
	e.sim.Mutate(2000)

	// Kill it once a good part of the stream has been answered.
	deadline := time.Now().Add(time.Minute)
	for e.sim.WebhookStats().Attempts < 400 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d webhook attempts in a minute", e.sim.WebhookStats().Attempts)
		}
		time.Sleep(5 * time.Millisecond) // polling the sim's counter, with a deadline
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.cmd.Wait()
	second, _ := start()

	idle, stop := context.WithTimeout(ctx, 2*time.Minute)
	defer stop()
	if err := e.sim.WebhooksIdle(idle); err != nil {
		t.Fatalf("sim's deliveries did not finish: %v", err)
	}
	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	second.cmd.Wait()
	if code := second.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("serve exit %d after SIGTERM, want 0", code)
	}

	db, err := store.Open(context.Background(), e.db, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	acked := map[string]bool{}
	failedAttempts := 0
	for _, a := range e.sim.WebhookLog() {
		if a.Status >= 200 && a.Status < 300 {
			acked[a.EventID] = true
		} else {
			failedAttempts++
		}
	}
	missing := 0
	for id := range acked {
		if _, ok, err := db.ProcessedEvent(context.Background(), id); err != nil {
			t.Fatal(err)
		} else if !ok {
			missing++
			if missing <= 5 {
				t.Errorf("event %s was answered 2xx but is not stored", id)
			}
		}
	}
	st := e.sim.WebhookStats()
	t.Logf("events %d, attempts %d (%d not 2xx), acknowledged %d, gave up %d, missing %d",
		st.Events, st.Attempts, failedAttempts, len(acked), st.GaveUp, missing)
	if missing > 0 {
		t.Fatalf("%d acknowledged events lost", missing)
	}
	if failedAttempts == 0 {
		t.Error("no attempt failed: the kill did not happen mid-stream")
	}
	if st.GaveUp > 0 {
		t.Errorf("the sim gave up on %d deliveries: serve did not come back in time", st.GaveUp)
	}
	if len(acked) != st.Events {
		t.Errorf("%d of %d events acknowledged", len(acked), st.Events)
	}
}

func TestServeNeedsASecret(t *testing.T) {
	e := newServeEnv(t, freeAddr(t), envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	code, _, stderr := e.run(context.Background(), "serve")
	// The error names the file and line of the key, as every other
	// configuration error does.
	if code != 2 || !regexp.MustCompile(`schedules\.yaml:\d+: intake\.secret is (empty|required)`).MatchString(stderr) {
		t.Fatalf("exit %d, want 2 naming schedules.yaml, a line and intake.secret\n%s", code, stderr)
	}
}

// A BACKSTOP_DRAIN_PERIOD that is not a duration of 0 or more is refused
// at start (exit 2, naming the variable), rather than silently replaced
// by the default 2 s; an empty one is the default.
func TestServeRefusesABadDrainPeriod(t *testing.T) {
	e := newServeEnv(t, freeAddr(t), envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	for _, v := range []string{"abc", "-1s", "5"} {
		// A serve that took the value would run until killed.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, binPath, "--config", e.config, "serve")
		cmd.Env = append(e.environ(e.sim.APIKey()), "BOTIX_WEBHOOK_SECRET="+webhookSecret, "BACKSTOP_DRAIN_PERIOD="+v)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(stderr.String(), `BACKSTOP_DRAIN_PERIOD "`+v+`": want a duration of 0 or more`) {
			t.Errorf("serve with BACKSTOP_DRAIN_PERIOD=%s: %v, want exit 2 naming the variable\n%s", v, err, stderr.String())
		}
	}
}

// An intake.path serve cannot route (one of its own endpoints, or a
// ServeMux wildcard) is a configuration error naming the file, line and
// key, exit 2, not a panic when serve builds its routes.
func TestServeRefusesAnIntakePathItCannotRoute(t *testing.T) {
	for _, path := range []string{"/ui", "/", "/outbox/{target}", "/hooks/{x}"} {
		t.Run(path, func(t *testing.T) {
			addr := freeAddr(t)
			e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
			e.writeConfig(fmt.Sprintf(`source:
  base_url: %s
  api_key: ${BOTIX_API_KEY}
store:
  path: %s
intake:
  listen: %s
  path: "%s"
  secret: s
dashboard:
  token: t
`, e.srv.URL, e.db, addr, path))
			code, _, stderr := e.run(context.Background(), "serve")
			if want := "schedules.yaml:8: intake.path: "; code != 2 || !strings.Contains(stderr, want) || strings.Contains(stderr, "panic") {
				t.Fatalf("exit %d, want 2 with %q\n%s", code, want, stderr)
			}
		})
	}
}

// serveProc is a running serve binary with its address and webhook secret.
type serveProc struct {
	*procHandle
	e    *env
	addr string
}

// proxyToken is the intake.proxy_token of startServe's config.
const proxyToken = "proxy-token-for-serve"

// startServe runs serve, on a fresh newServeEnv with webhook-proxy mode on,
// and waits until it listens.
func startServe(t *testing.T, env ...string) *serveProc {
	t.Helper()
	return startServeIntake(t, "  proxy_token: "+proxyToken+"\n", env...)
}

// startServeIntake is startServe with intake keys of its own (indented
// lines) in place of the proxy token.
func startServeIntake(t *testing.T, intakeKeys string, env ...string) *serveProc {
	t.Helper()
	return startServeEdited(t, func(cfg string) string {
		return strings.Replace(cfg, "intake:\n", "intake:\n"+intakeKeys, 1)
	}, env...)
}

// startServeEdited is startServe with its configuration file as edit
// makes it, in place of the proxy token.
func startServeEdited(t *testing.T, edit func(string) string, env ...string) *serveProc {
	t.Helper()
	addr := freeAddr(t)
	e := newServeEnv(t, addr, envOpts{sim: sim.Options{Seed: 1, Objects: 5}})
	data, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	e.writeConfig(edit(string(data)))
	p, lines := e.startBinaryEnv(append(append(e.environ(e.sim.APIKey()), "BOTIX_WEBHOOK_SECRET="+webhookSecret), env...), "serve")
	waitLines(t, lines, "serving", 1, 30*time.Second)
	go func() {
		for range lines { // keep the process's stderr flowing
		}
	}()
	return &serveProc{procHandle: p, e: e, addr: addr}
}

// webhookHead is the head of a signed webhook request for body.
func webhookHead(body []byte) string {
	return fmt.Sprintf("POST /webhooks/botix HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Botix-Signature: %s\r\nContent-Length: %d\r\n",
		intake.SignBotix(webhookSecret, body), len(body))
}

func paymentWebhook(id, payID string) []byte {
	return []byte(fmt.Sprintf(`{"event_id":%q,"event":"payment.succeeded","created_at":"2026-03-01T10:00:00Z","data":{"id":%q,"contact_id":"ct_1","amount":100,"currency":"EUR","status":"succeeded","created_at":"2026-03-01T10:00:00Z","updated_at":"2026-03-01T10:00:00Z"}}`, id, payID))
}

// doJSON sends req with c and returns the answer, its body and the body
// decoded as a JSON object (nil when it is not one).
func doJSON(t *testing.T, c *http.Client, req *http.Request) (*http.Response, []byte, map[string]any) {
	t.Helper()
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var v map[string]any
	json.Unmarshal(b, &v)
	return res, b, v
}

// readJSONAnswer reads one response from br and decodes its JSON body.
func readJSONAnswer(t *testing.T, br *bufio.Reader) (*http.Response, map[string]any) {
	t.Helper()
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%d answer is not JSON: %q", res.StatusCode, b)
	}
	return res, v
}

// errorCode is the code of a {"error":{"code":…}} answer.
func errorCode(v map[string]any) string {
	e, _ := v["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

// A webhook whose body is sent one byte a second gets its 408 JSON answer
// within serve's body timeout, rather than a connection closed without a
// word when serve's read and write timeouts pass together; nothing is
// stored and serve stays up.
func TestServeAnswersASlowBody408(t *testing.T) {
	s := startServe(t)
	body := paymentWebhook("evt_slow", "pay_slow")
	conn, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, webhookHead(body)+"\r\n")
	answered := make(chan struct{})
	go func() {
		tick := time.NewTicker(time.Second) // the sender's pace, not a wait for serve
		defer tick.Stop()
		for i := 0; i < len(body)-1; i++ {
			if _, err := conn.Write(body[i : i+1]); err != nil {
				return
			}
			select {
			case <-answered:
				return
			case <-tick.C:
			}
		}
	}()
	// Well before serve's 30 s read and write timeouts.
	conn.SetReadDeadline(time.Now().Add(intake.DefaultBodyTimeout + 10*time.Second))
	res, v := readJSONAnswer(t, bufio.NewReader(conn))
	close(answered)
	if res.StatusCode != http.StatusRequestTimeout || errorCode(v) != "body_timeout" {
		t.Errorf("slow body answered %d %v, want 408 body_timeout", res.StatusCode, v)
	}

	db := s.e.openStore()
	defer db.Close()
	if n, err := db.CountProcessed(context.Background()); err != nil || n != 0 {
		t.Errorf("%d events stored (%v), want none", n, err)
	}
	c2, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatalf("serve is not up after a slow sender: %v", err)
	}
	defer c2.Close()
	fmt.Fprint(c2, webhookHead(body)+"\r\n"+string(body))
	if res, v := readJSONAnswer(t, bufio.NewReader(c2)); res.StatusCode != 200 {
		t.Errorf("the whole body, at once, answered %d %v", res.StatusCode, v)
	}
}

// serve's own endpoints answer a method they do not serve 405 with an
// Allow header, not 404 "no such endpoint".
func TestServeOwnEndpointsAnswer405ToOtherMethods(t *testing.T) {
	s := startServe(t)
	for _, c := range []struct{ method, path string }{
		{http.MethodPost, "/healthz"}, {http.MethodDelete, "/readyz"}, {http.MethodPost, "/metrics"}, {http.MethodPut, "/healthz"},
	} {
		req, _ := http.NewRequest(c.method, "http://"+s.addr+c.path, strings.NewReader("{}"))
		res, b, v := doJSON(t, http.DefaultClient, req)
		if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != "GET, HEAD" || errorCode(v) != "method_not_allowed" {
			t.Errorf("%s %s: %d Allow %q %s, want 405, Allow GET, HEAD and a JSON method_not_allowed error",
				c.method, c.path, res.StatusCode, res.Header.Get("Allow"), b)
		}
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		res, err := http.Get("http://" + s.addr + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d", path, res.StatusCode)
		}
	}
}

// A path serve does not answer is 404 naming it as it was sent: a
// percent-encoded slash read as a real one, "POST /webhooks/botix", the
// very path it said webhooks go to.
func TestServeNotFoundNamesThePathAsSent(t *testing.T) {
	s := startServe(t)
	res, err := http.Post("http://"+s.addr+"/webhooks%2Fbotix", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound || !strings.Contains(string(b), "no such endpoint: POST /webhooks%2Fbotix (webhooks go to POST /webhooks/botix)") {
		t.Errorf("POST /webhooks%%2Fbotix: %d %s, want 404 naming the path as sent", res.StatusCode, b)
	}
}

// serve without its webhook secret is a configuration error (exit 2, file,
// line and key) found before the store is touched: no store file is left
// behind, and another serve holding the store does not hide it behind its
// claim.
func TestServeConfigErrorBeforeTheStore(t *testing.T) {
	addr := freeAddr(t)
	e := newServeEnv(t, addr, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	env := e.environ(e.sim.APIKey()) // no BOTIX_WEBHOOK_SECRET
	dir := t.TempDir()
	code, _, stderr := runBinary(t, dir, append(env, "BOTIX_WEBHOOK_SECRET="), "--config", e.config, "serve")
	if code != exitUsage || !strings.Contains(stderr, "intake.secret") || !strings.Contains(stderr, "schedules.yaml:") {
		t.Errorf("serve without its secret: exit %d %s; want 2 naming the file, line and key", code, stderr)
	}
	if left, _ := filepath.Glob(e.db + "*"); len(left) != 0 {
		t.Errorf("a serve refused for its configuration left %v", left)
	}

	proc, lines := e.startBinaryEnv(append(env, "BOTIX_WEBHOOK_SECRET="+webhookSecret), "serve")
	waitLines(t, lines, "serving", 1, stepTimeout)
	defer func() {
		proc.cmd.Process.Signal(syscall.SIGTERM)
		proc.cmd.Wait()
	}()
	code, _, stderr = runBinary(t, dir, append(env, "BOTIX_WEBHOOK_SECRET="), "--config", e.config, "serve")
	if code != exitUsage || !strings.Contains(stderr, "intake.secret") {
		t.Errorf("serve without its secret beside a running serve: exit %d %s; want 2 naming intake.secret", code, stderr)
	}
}

// A path that is not clean (a doubled slash, a dot segment: a sender's
// URL joined badly) is answered 308 to the clean one, which keeps the
// method and the body, with a JSON error saying what to fix; a sender
// that follows it is served there. net/http's own redirect had no body,
// and a sender that turns a redirected POST into a GET lost the webhook.
func TestServeRedirectsAnUncleanPathWithAJSONError(t *testing.T) {
	s := startServe(t)
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for i, path := range []string{"//webhooks/botix", "/webhooks/x/../botix", "/./webhooks/botix"} {
		body := paymentWebhook(fmt.Sprintf("evt_unclean_%d", i), fmt.Sprintf("pay_unclean_%d", i))
		req, _ := http.NewRequest(http.MethodPost, "http://"+s.addr+path+"?via=test", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Botix-Signature", intake.SignBotix(webhookSecret, body))
		res, b, v := doJSON(t, noFollow, req)
		if res.StatusCode != http.StatusPermanentRedirect || res.Header.Get("Location") != "/webhooks/botix?via=test" ||
			errorCode(v) != "unclean_path" || !strings.Contains(string(b), "/webhooks/botix") {
			t.Errorf("POST %s: %d Location %q %s, want 308 to /webhooks/botix?via=test with a JSON unclean_path error",
				path, res.StatusCode, res.Header.Get("Location"), b)
		}
		// http.Client follows a 308 with the same method and body.
		if code, answer := postSigned(t, "http://"+s.addr+path, webhookSecret, body); code != http.StatusOK || !strings.Contains(string(answer), "accepted") {
			t.Errorf("POST %s, redirect followed: %d %s, want 200 accepted", path, code, answer)
		}
		if code, answer := postSigned(t, "http://"+s.addr+"/webhooks/botix", webhookSecret, body); code != http.StatusOK || !strings.Contains(string(answer), "duplicate") {
			t.Errorf("the same webhook at the clean path: %d %s, want 200 duplicate (stored once)", code, answer)
		}
	}
}

// cleanPaths cleans the path as it was sent, as ServeMux does: encoded
// slashes and dots are part of a segment and go through, the Location
// keeps the query and never names another host, and CONNECT and "*" are
// left to ServeMux.
func TestCleanPathsAsServeMuxCleans(t *testing.T) {
	var served []string
	h := cleanPaths(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served = append(served, r.URL.EscapedPath())
	}))
	for _, c := range []struct {
		method, target string
		location       string // "" when served
	}{
		{"POST", "/webhooks/botix", ""},
		{"POST", "/outbox/a%2F%2Fb", ""},
		{"POST", "/outbox/%2e%2e", ""},
		{"GET", "/ui/", ""},
		{"POST", "//webhooks/botix?a=1&b=2", "/webhooks/botix?a=1&b=2"},
		{"GET", "//evil.example/x", "/evil.example/x"},
		{"GET", "///evil.example/x", "/evil.example/x"},
		{"GET", "/.//evil.example", "/evil.example"},
		{"GET", "/ui//deliveries/", "/ui/deliveries/"},
		{"HEAD", "/a/../b", "/b"},
		{"POST", "/webhooks/%2e%2e/../botix", "/webhooks/botix"}, // %2e%2e is a segment, as in ServeMux
		{"GET", "http://host//webhooks/botix", "/webhooks/botix"},
	} {
		served = nil
		req := httptest.NewRequest(c.method, c.target, nil)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if c.location == "" {
			if rec.Code != http.StatusOK || len(served) != 1 {
				t.Errorf("%s %s: %d, served %v; want it served as sent", c.method, c.target, rec.Code, served)
			}
			continue
		}
		var v map[string]any
		json.Unmarshal(rec.Body.Bytes(), &v)
		loc := rec.Header().Get("Location")
		if rec.Code != http.StatusPermanentRedirect || loc != c.location || len(served) != 0 ||
			(c.method != "HEAD" && errorCode(v) != "unclean_path") {
			t.Errorf("%s %s: %d Location %q %s, want 308 to %q with an unclean_path error", c.method, c.target, rec.Code, loc, rec.Body, c.location)
		}
		if strings.HasPrefix(loc, "//") || !strings.HasPrefix(loc, "/") {
			t.Errorf("%s %s: Location %q is not a path on this server", c.method, c.target, loc)
		}
	}
	for _, req := range []*http.Request{
		{Method: http.MethodConnect, URL: &url.URL{Host: "h:443"}, RequestURI: "h:443", Header: http.Header{}},
		{Method: http.MethodGet, URL: &url.URL{Path: "*"}, RequestURI: "*", Header: http.Header{}},
	} {
		served = nil
		h.ServeHTTP(httptest.NewRecorder(), req)
		if len(served) != 1 {
			t.Errorf("%s %s went to no handler: ServeMux answers it", req.Method, req.RequestURI)
		}
	}
}
