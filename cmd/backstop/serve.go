package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/cmd/backstop/config"
	"github.com/backstop-sync/backstop/sinks/delivery"
	"github.com/backstop-sync/backstop/sinks/intake"
	"github.com/backstop-sync/backstop/store"
	bsync "github.com/backstop-sync/backstop/sync"
)

// shutdownTimeout bounds how long serve waits for in-flight requests and
// commits after SIGTERM.
const shutdownTimeout = 30 * time.Second

// drainPeriod bounds how long serve, once told to stop, keeps the
// connections that are already open: a request sent on one of them is
// answered 503 (Retry-After, Connection: close) rather than cut off, and
// /readyz tells a load balancer it is draining. The drain ends earlier once
// every connection has closed; then the requests still in flight are
// finished (shutdownTimeout) and serve exits. Short, so that Ctrl-C stays
// quick.
const drainPeriod = 2 * time.Second

// drainPeriod is BACKSTOP_DRAIN_PERIOD, a duration of 0 or more (a load
// balancer that takes longer to stop sending may need more), or the
// drainPeriod constant when it is unset or empty; any other value is a
// usage error, so that a typo is not a silent 2 s.
func (m *Main) drainPeriod() (time.Duration, error) {
	if m.LookupEnv == nil {
		return drainPeriod, nil
	}
	v, ok := m.LookupEnv("BACKSTOP_DRAIN_PERIOD")
	if !ok || v == "" {
		return drainPeriod, nil
	}
	d, err := config.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, usagef("BACKSTOP_DRAIN_PERIOD %q: want a duration of 0 or more such as 2s or 30s", v)
	}
	return time.Duration(d), nil
}

func (m *Main) serveCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Receive the platform's webhooks (verified, de-duplicated, durable before 2xx)",
		Long: `serve listens on intake.listen and accepts the platform's webhooks on
POST {intake.path}. Each request's signature is verified over the raw body
(intake.scheme: botix, standard-webhooks, github or stripe; several secrets are
accepted during a rotation), its event is de-duplicated on processed_events,
applied to the mirror when newer and queued for every target whose events match,
all in one transaction, and only then answered 2xx. Concurrent requests share
commits (group commit, at most intake.max_batch per commit; a commit smaller
than the one before waits intake.linger for more to join it). Truncated events
are completed by fetching their object from the API.

serve also delivers the outbox to the targets (one worker per target, retries,
dead letters; see backstop deliveries), runs the jobs of schedules.yaml (with
governor.redis, only on the process holding the jobs lease), and with
intake.proxy_token accepts POST /outbox/{target} (webhook-proxy mode).

Also served: GET /healthz (200 while the process is up), GET /readyz (503
while draining, when the store cannot be reached, or after a webhook commit
failed, such as on a full disk, until a test write commits again and the
disk has room), GET
/metrics (Prometheus) and, with dashboard.token set, the dashboard under /ui.
With admin.listen set, /ui and /metrics are served on that address instead
(the probes on both), away from the address the platform reaches.

Without governor.redis only one serve may run on a store: a second one exits
1 saying so. With it, several share the work (one runs the jobs).

SIGTERM or Ctrl-C: stop accepting connections; for up to 2 s
(BACKSTOP_DRAIN_PERIOD changes it), until the open ones have closed, answer 503 (Retry-After, Connection: close) to new
requests on them, /readyz included (/healthz stays 200); finish the requests
and commits in flight, exit 0. SIGHUP is logged and ignored: serve does not
reload schedules.yaml; restart it to apply changes.

Exit codes: 0 stopped by SIGTERM or Ctrl-C; 1 it could not start or had to
stop (another serve holds the store, a store it cannot write); 2 bad
configuration (the file, line and key are named) or a listen address in use.`,
		Args: cobraArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return m.serve(cmd.Context(), g)
		},
	}
}

func (m *Main) serve(ctx context.Context, g *globals) error {
	drain, err := m.drainPeriod()
	if err != nil {
		return err
	}
	// serve does not reload its configuration: SIGHUP (systemctl reload, a
	// closed terminal) is logged and otherwise ignored, rather than kill
	// the process at once as Go's default would, without draining.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// serve's own settings are checked before the store is touched, so
	// that a mistake there creates no store file and is not hidden behind
	// another serve's claim. (A configuration that does not load at all is
	// reported by openAppWith, before it opens the store.)
	if cfg, err := m.loadConfig(g, false); err == nil {
		if _, err := serveVerifier(cfg); err != nil {
			return err
		}
	}
	release, err := m.claimStore(ctx, g)
	if err != nil {
		return err
	}
	defer release()
	a, err := m.openAppWith(ctx, g, m.Stderr, func(c *config.Config) string { return c.Intake.Synchronous })
	if err != nil {
		return err
	}
	defer a.Close()
	cfg, log := a.cfg, a.log
	if e := cfg.ScheduleProblem(); e != nil {
		return usageError{e}
	}
	// A store it can read but not write (a file restored as another user,
	// a read-only mount) would open, say ready, and answer every webhook
	// 503: refused here instead. A write lock held elsewhere is only
	// transient (another command's commit, a VACUUM): /readyz reports it
	// while it lasts.
	if err := a.db.PingWrite(ctx); err != nil {
		if !store.LockHeld(err) {
			return fmt.Errorf("%s: %w", withCause("serve needs a store it can write", err), err)
		}
		log.Warn("the store's write lock is held by another process; webhooks wait for it", "error", err)
	}
	warnUnpruned(cfg, log)
	warnBackupDirs(cfg, log)
	for _, w := range cfg.Warnings() {
		log.Warn("configuration: "+w.Key+" "+w.Msg, "file", w.File, "line", w.Line, "key", w.Key)
	}
	if err := warnUnconfiguredTargets(ctx, a.db, cfg.Targets, log); err != nil {
		return err
	}
	verifier, err := serveVerifier(cfg)
	if err != nil {
		return err
	}
	routes := routesOf(cfg)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a.registerMetrics(reg) // the shared governor's fallbacks and the jobs lease
	registerStoreSize(reg, a.db.Path())
	reg.MustRegister(newDeadLetterCollector(a.db, cfg.Targets))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "backstop_build_info",
		Help:        "Always 1; its version label is this serve's version, as backstop version prints it.",
		ConstLabels: prometheus.Labels{"version": servedVersion()},
	}, func() float64 { return 1 }))
	// Every platform call's cost is counted (a.meter) for the dashboard's
	// quota page; the truncated-event fetcher goes through it too.
	meter := a.meter
	jobMetrics := newJobMetrics(reg)
	lastRuns, err := a.db.LastJobFinishes(ctx)
	if err != nil {
		return err
	}
	jobNames := make([]string, len(cfg.Jobs))
	for i, j := range cfg.Jobs {
		jobNames[i] = j.Name
	}
	jobMetrics.seed(jobNames, lastRuns)
	jobMetrics.readLast = a.db.LastJobFinishes
	sched, err := a.schedulerWith(jobMetrics)
	if err != nil {
		return err
	}
	// The scheduler is stopped before the store closes (a.Close, deferred
	// above), also when serve fails before shutting down in order.
	schedStopped := false
	stopScheduler := func() error {
		if schedStopped {
			return nil
		}
		schedStopped = true
		return sched.Stop()
	}
	defer stopScheduler()

	ln, err := net.Listen("tcp", cfg.Intake.Listen)
	if err != nil {
		return usagef("intake.listen %s: %v", cfg.Intake.Listen, err)
	}
	var adminLn net.Listener
	if cfg.Admin.Listen != "" {
		if adminLn, err = net.Listen("tcp", cfg.Admin.Listen); err != nil {
			ln.Close()
			return usagef("admin.listen %s: %v", cfg.Admin.Listen, err)
		}
	}
	closeListeners := func() {
		ln.Close()
		if adminLn != nil {
			adminLn.Close()
		}
	}
	queue := newDeliveryQueue(a.db)
	dispatcher, err := delivery.New(queue, deliveryTargets(cfg), delivery.Options{
		Logger: log, Registerer: reg, // the dispatcher names its component itself
		Pacers: a.deliveryPacers(ctx, log.With("component", "target-governor")),
	})
	if err != nil {
		closeListeners()
		return usagef("targets: %v", err)
	}
	// Each commit that queues rows wakes their targets' workers, so a
	// webhook is delivered on at once, not at the dispatcher's next poll;
	// so does each page a sync job emits and each reconcile's re-emission
	// (the scheduler, not started yet, runs its jobs on a.engine).
	// It also commits the emitting runs' pages (EmitGuard), refusing one
	// whose cursor backstop cursors reset reset since the run read it;
	// as the Mirror it also emits a reconcile's events (EmitChanged),
	// leaving out one whose object a webhook brought in a newer version
	// meanwhile.
	waking := wakingStore{DB: a.db, wake: dispatcher.Wake}
	a.engine.Mirror = waking
	a.engine.EmitGuard = waking
	stack := startIntake(ctx, a.db, meter, verifier,
		intakeOptions{routes: routes, maxBatch: cfg.Intake.MaxBatch, linger: cfg.Intake.Linger.Std(), onQueued: dispatcher.Wake}, log, reg)
	handler := stack.handler
	dash, err := startUI(ctx, uiDeps{a: a, sched: sched, dispatcher: dispatcher, intake: stack.metrics, meter: meter})
	if err != nil {
		closeListeners()
		stack.stop(ctx)
		return err
	}
	dispatchCtx, stopDispatch := context.WithCancel(context.WithoutCancel(ctx))
	dispatchDone := make(chan struct{})
	go func() {
		defer close(dispatchDone)
		dispatcher.Run(dispatchCtx)
	}()
	targetNames := make([]string, len(cfg.Targets))
	maxPayload := make(map[string]int, len(cfg.Targets))
	for i, t := range cfg.Targets {
		targetNames[i] = t.Name
		if t.MaxPayload > 0 {
			maxPayload[t.Name] = t.MaxPayload
		}
	}

	// With admin.listen, /ui and /metrics move to the admin address and
	// are no longer answered where the platform's webhooks come in; the
	// probes are answered on both.
	mux, admin := http.NewServeMux(), http.NewServeMux()
	if adminLn == nil {
		admin = mux
	}
	mux.Handle(cfg.Intake.Path, timeRequests(handler, reg))
	mux.Handle("/outbox/{target}", intake.NewProxy(a.db, intake.ProxyOptions{
		Tokens: cfg.Intake.AllProxyTokens(), Targets: targetNames, MaxPayload: maxPayload, Logger: log.With("component", "proxy"),
		OnQueued: dispatcher.Wake,
	}))
	healthz := getOnly(func(w http.ResponseWriter, _ *http.Request) {
		writeJSONStatus(w, http.StatusOK, "ok")
	})
	// After a failed commit each /readyz makes a test write, which holds
	// the store's one writer connection: a second's probes share one.
	// The answers name the cause in a few words (store.Cause) but never
	// the store's path or the driver's message: /readyz may be public.
	// Those go to the log, once per probe run.
	pingProbe := &cachedProbe{every: time.Second}
	writeProbe := &cachedProbe{every: time.Second}
	readyz := getOnly(func(w http.ResponseWriter, r *http.Request) {
		if stack.damaged.Load() != nil {
			intake.WriteError(w, http.StatusServiceUnavailable, "store_damaged",
				"the store file is damaged (a webhook commit found it so): serve is not ready until it is restarted on a sound store; serve's log has the details")
			return
		}
		pingErr := pingProbe.check(r.Context(), func(ctx context.Context) error {
			err := a.db.Ping(ctx)
			if err != nil && !store.LockHeld(err) { // a writer held up: the test write below logs it
				log.Error("not ready: the store cannot be reached", "error", err)
			}
			return err
		})
		if pingErr != nil && !store.LockHeld(pingErr) {
			intake.WriteError(w, http.StatusServiceUnavailable, "store_unavailable", withCause("the store cannot be reached", pingErr)+"; serve's log has the details")
			return
		}
		// The store answers, but when the last webhook commit failed
		// (a full disk, a lock held elsewhere), or its writer is held up
		// (store.ErrWriterBusy: writes queued behind a lock held
		// elsewhere), serve is not ready until a write of its own commits
		// again; without this check a serve answering every webhook 503
		// said it was ready.
		if failed := stack.metrics.CommitFailure(); failed != nil || pingErr != nil {
			why := "the last webhook commit failed and so did a test write"
			if failed == nil {
				why = "the store's writer is held up and a test write failed"
			}
			if err := writeProbe.check(r.Context(), func(ctx context.Context) error {
				err := a.db.PingWrite(ctx)
				if err != nil {
					log.Error("not ready: "+why, "commit_error", failed, "error", err)
				}
				return err
			}); err != nil {
				if store.Cause(err) == "" && failed != nil {
					err = failed
				}
				intake.WriteError(w, http.StatusServiceUnavailable, "store_error",
					withCause("the store cannot commit", err)+": "+why+"; serve's log has the details")
				return
			}
			if failed != nil {
				stack.metrics.CommitRecovered(failed)
			}
		}
		writeJSONStatus(w, http.StatusOK, "ready")
	})
	mux.Handle("/healthz", healthz)
	mux.Handle("/readyz", readyz)
	if adminLn != nil {
		admin.Handle("/healthz", healthz)
		admin.Handle("/readyz", readyz)
	}
	admin.Handle("/ui", dash.handler)
	admin.Handle("/ui/", dash.handler)
	admin.Handle("/metrics", getOnly(promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}).ServeHTTP))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		hint := ""
		if adminLn != nil && (r.URL.Path == "/metrics" || r.URL.Path == "/ui" || strings.HasPrefix(r.URL.Path, "/ui/")) {
			hint = "; /ui and /metrics are on admin.listen"
		}
		intake.WriteError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no such endpoint: %s %s (webhooks go to POST %s%s)", r.Method, r.URL.EscapedPath(), cfg.Intake.Path, hint))
	})
	if adminLn != nil {
		admin.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			intake.WriteError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no such endpoint: %s %s (this is the admin address: /ui, /metrics, /healthz, /readyz; webhooks go to intake.listen)", r.Method, r.URL.EscapedPath()))
		})
	}

	conns := newOpenConns()
	newServer := func(h http.Handler, conns *openConns) *http.Server {
		return &http.Server{
			// While draining, the intake answers its own 503s (counted
			// in its metrics) and /healthz stays 200; the gate answers
			// the rest.
			Handler: realClient(drainGate(cleanPaths(h), handler.Draining, "/healthz", cfg.Intake.Path), cfg.Intake.TrustedPrefixes()),
			// The intake's body deadline (intake.DefaultBodyTimeout,
			// 10 s) is well within WriteTimeout, so a body that does not
			// arrive in time still gets its 408.
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       30 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       90 * time.Second,
			MaxHeaderBytes:    64 << 10,
			ConnState:         conns.track,
			ErrorLog:          slog.NewLogLogger(log.With("component", "http").Handler(), slog.LevelWarn),
		}
	}
	srv := newServer(mux, conns)
	serveErr := make(chan error, 2)
	go func() { serveErr <- srv.Serve(ln) }()
	var adminSrv *http.Server
	adminConns := newOpenConns()
	if adminLn != nil {
		adminSrv = newServer(admin, adminConns)
		go func() { serveErr <- adminSrv.Serve(adminLn) }()
	}
	sched.Start()
	attrs := []any{"addr", "http://" + ln.Addr().String(), "version", servedVersion(), "webhooks", "POST " + cfg.Intake.Path,
		"scheme", cfg.Intake.Scheme, "targets", len(routes), "synchronous", cfg.Intake.Synchronous,
		"jobs", len(cfg.Jobs)}
	if adminLn != nil {
		attrs = append(attrs, "admin", "http://"+adminLn.Addr().String())
	}
	log.Info("serving", attrs...)
	fmt.Fprintf(m.Stdout, "listening on http://%s\n", ln.Addr())
	if adminLn != nil {
		fmt.Fprintf(m.Stdout, "admin (/ui, /metrics) on http://%s\n", adminLn.Addr())
	}

	var runErr error
wait:
	for {
		select {
		case <-hup:
			log.Warn("SIGHUP ignored: serve does not reload its configuration; to apply changes to "+g.configPath+
				", stop it (SIGTERM) and start it again", "config", g.configPath)
		case <-ctx.Done():
			log.Info("shutting down: draining requests and commits in flight")
			// No new connection: the listeners close, and Serve returns
			// (its error is that one) once it has handed over every
			// connection it accepted.
			closeListeners()
			<-serveErr
			if adminLn != nil {
				<-serveErr
			}
			break wait
		case err := <-serveErr:
			runErr = fmt.Errorf("serve: %w", err)
			break wait
		}
	}
	// New requests on the open connections are answered 503 and close
	// them, while the requests in flight finish.
	handler.Drain()
	drainEnd := time.NewTimer(drain)
	defer drainEnd.Stop()
	// Running jobs see their context cancelled: a sync finishes its page
	// and saves its cursor; the stop timeout bounds the wait.
	if err := stopScheduler(); err != nil {
		runErr = errors.Join(runErr, fmt.Errorf("stop jobs: %w", err))
	}
	select {
	case <-conns.allClosed():
		if adminLn != nil {
			select {
			case <-adminConns.allClosed():
			case <-drainEnd.C:
			}
		}
	case <-drainEnd.C:
	}
	// Shutdown closes the connections that stayed idle, and waits for
	// those with a request in flight.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		runErr = errors.Join(runErr, fmt.Errorf("shutdown: %w", err))
	}
	if adminSrv != nil {
		if err := adminSrv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			runErr = errors.Join(runErr, fmt.Errorf("shutdown admin: %w", err))
		}
	}
	if err := dash.Close(sctx); err != nil {
		runErr = errors.Join(runErr, err)
	}
	if err := stack.stop(sctx); err != nil {
		runErr = errors.Join(runErr, err)
	}
	// No new attempt starts; those in flight get delivery.DefaultStopGrace
	// to be answered, and the dispatcher returns once every answered one
	// is recorded. One cut short after the grace keeps its lease and is
	// sent again after a restart (at least once, same event id).
	stopDispatch()
	<-dispatchDone
	if runErr == nil {
		log.Info("stopped cleanly")
	}
	return runErr
}

// claimStore takes the store's serve claim: alone without governor.redis,
// since nothing would then stop a second serve on the store from running
// every job again and spending the API budget on its own, and shared with
// the other serves of the store with it (but not beside one without). It runs
// before the store is opened, so that a second serve of a newer version
// is refused before it migrates the store under the first. A
// configuration that does not load, or a store directory that does not
// exist, is left for openAppWith to report.
func (m *Main) claimStore(ctx context.Context, g *globals) (release func() error, err error) {
	none := func() error { return nil }
	cfg, err := m.loadConfig(g, false)
	if err != nil {
		return none, nil
	}
	if err := storeDirProblem(cfg); err != nil {
		// The claim's own error ("claim ….serve-lock: attempt to write a
		// readonly database") would hide what is wrong.
		return nil, err
	}
	if cfg.Governor.Redis != "" {
		// Serves sharing the work through Redis hold the claim together,
		// but not beside one that runs every job on its own.
		release, err = store.ClaimShared(ctx, cfg.Store.Path, "serve")
		if errors.Is(err, store.ErrClaimed) {
			return nil, fmt.Errorf("the store %s is in use by a backstop serve without governor.redis, which runs every scheduled job on its own: "+
				"stop it, or give it governor.redis too, before starting serves that share the work through Redis", cfg.Store.Path)
		}
		return release, err
	}
	release, err = store.Claim(ctx, cfg.Store.Path, "serve")
	if errors.Is(err, store.ErrClaimed) {
		return nil, fmt.Errorf("the store %s is in use by another backstop serve: without governor.redis only one serve may run on a store "+
			"(each would run every scheduled job and spend the API budget on its own); stop the other one, or set governor.redis to run several", cfg.Store.Path)
	}
	return release, err
}

// serveVerifier returns the webhook verifier of cfg's intake: its scheme
// with every secret accepted (a rotation's too). Without a secret, or with
// a scheme it cannot build, it is a configuration error naming the key.
func serveVerifier(cfg *config.Config) (intake.Verifier, error) {
	secrets := make([]string, 0, 2)
	for _, s := range cfg.Intake.AllSecrets() {
		secrets = append(secrets, s.Value())
	}
	if len(secrets) == 0 {
		return nil, usageError{cfg.Missing("intake.secret", "serve needs the webhook signing secret (e.g. secret: ${BOTIX_WEBHOOK_SECRET})")}
	}
	verifier, err := intake.NewVerifier(cfg.Intake.Scheme, intake.SchemeOptions{Secrets: secrets, Tolerance: cfg.Intake.Tolerance.Std()})
	if err != nil {
		return nil, usagef("intake: %v", err)
	}
	return verifier, nil
}

// warnUnpruned warns when no maintenance job is configured: nothing then
// prunes processed_events, the delivery log or the job runs, and the store
// grows without end.
func warnUnpruned(cfg *config.Config, log *slog.Logger) {
	for _, j := range cfg.Jobs {
		if j.Kind == config.KindMaintenance {
			return
		}
	}
	log.Warn("no maintenance job in jobs: processed events, delivered deliveries, delivery attempts and job runs are never pruned and the store grows without end; " +
		`add one, e.g. {name: prune, kind: maintenance, cron: "30 4 * * *"}`)
}

// warnBackupDirs warns, at serve's start rather than at the first run
// hours later, of a backup job whose directory does not exist or is not
// a directory.
func warnBackupDirs(cfg *config.Config, log *slog.Logger) {
	for _, j := range cfg.Jobs {
		if j.Kind != config.KindBackup {
			continue
		}
		if fi, err := os.Stat(j.Dir); err != nil {
			log.Warn("backup job's directory: its runs will fail until it exists", "job", j.Name, "dir", j.Dir, "err", errors.Unwrap(err))
		} else if !fi.IsDir() {
			log.Warn("backup job's directory is not a directory: its runs will fail", "job", j.Name, "dir", j.Dir)
		}
	}
}

// servedVersion is the version part of versionString ("v1.2.3",
// "dev-<revision>" or "(devel)").
func servedVersion() string {
	if f := strings.Fields(versionString()); len(f) > 1 {
		return f[1]
	}
	return "(devel)"
}

// registerStoreSize exports the size of the store's database file and of
// its write-ahead log, read at each scrape, so that disk growth can be
// watched and alerted on: a WAL far over its usual few megabytes means a
// long read transaction (a sqlite3 shell, a backup) holds back checkpoints.
func registerStoreSize(reg prometheus.Registerer, path string) {
	for _, f := range []struct{ label, path string }{{"database", path}, {"wal", path + "-wal"}} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "backstop_store_size_bytes",
			Help:        "Size of the store's SQLite files: the database and its write-ahead log (wal).",
			ConstLabels: prometheus.Labels{"file": f.label},
		}, func() float64 {
			fi, err := os.Stat(f.path)
			if err != nil {
				return 0 // no WAL file (yet, or after a clean close)
			}
			return float64(fi.Size())
		}))
	}
}

// deadLetterEvery is how long serve reuses its count of the stored dead
// letters for /metrics.
const deadLetterEvery = 10 * time.Second

// deadLetterCollector exports each configured target's dead letters as
// stored (kept until retried or purged), counted at a scrape at most every
// deadLetterEvery: unlike backstop_delivery_dead_letters_total, which
// counts from zero in each process, it says how many wait right after a
// restart, and falls once they are retried or purged.
type deadLetterCollector struct {
	db      *store.DB
	targets []string
	desc    *prometheus.Desc

	mu     sync.Mutex
	at     time.Time
	counts map[string]int
}

func newDeadLetterCollector(db *store.DB, targets []config.Target) *deadLetterCollector {
	names := make([]string, len(targets))
	for i, t := range targets {
		names[i] = t.Name
	}
	return &deadLetterCollector{db: db, targets: names, desc: prometheus.NewDesc("backstop_delivery_dead_letter_depth",
		"Dead letters stored per target (kept until retried or purged), counted at most every 10 s.", []string{"target"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *deadLetterCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector: it counts again when the last
// count is older than deadLetterEvery, and keeps the last count when the
// store does not answer.
func (c *deadLetterCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil || time.Since(c.at) >= deadLetterEvery {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		counts, err := c.db.DeadLetterCounts(ctx, c.targets)
		cancel()
		if err == nil {
			c.counts, c.at = counts, time.Now()
		}
	}
	for t, n := range c.counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), t)
	}
}

// routesOf lists the targets' subscriptions for the emit path.
func routesOf(cfg *config.Config) []backstop.Route {
	routes := make([]backstop.Route, 0, len(cfg.Targets))
	for _, t := range cfg.Targets {
		routes = append(routes, backstop.Route{Target: t.Name, Events: t.Events})
	}
	return routes
}

// timeRequests serves h and observes how long each answer took, by its
// status code, in backstop_intake_request_duration_seconds: the webhook
// answer latency the platform sees, drains and refusals included. A
// request whose sender went away before it was answered (nothing written,
// its context ended) is observed as 499, nginx's "client closed request",
// not as the 200 net/http would have sent had the sender been there.
func timeRequests(h http.Handler, reg prometheus.Registerer) http.Handler {
	hist := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "backstop_intake_request_duration_seconds",
		Help:    "Time from a webhook request's headers to its answer, by HTTP status code.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16), // 0.5 ms to 16 s
	}, []string{"code"})
	reg.MustRegister(hist)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		if sw.code == 0 {
			sw.code = http.StatusOK
			if r.Context().Err() != nil {
				sw.code = statusSenderGone
			}
		}
		hist.WithLabelValues(strconv.Itoa(sw.code)).Observe(time.Since(start).Seconds())
	})
}

// statusSenderGone is the code timeRequests observes for a request whose
// sender went away unanswered.
const statusSenderGone = 499

// statusWriter remembers the status code a handler answers. Unwrap lets
// http.ResponseController reach the connection beneath (the intake sets
// its read and write deadlines through it).
type statusWriter struct {
	http.ResponseWriter
	code int
}

// WriteHeader records code, then writes it.
func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write records an implicit 200, then writes b.
func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap returns the ResponseWriter beneath, for http.ResponseController.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// getOnly serves GET and HEAD with h, and answers any other method 405
// with an Allow header (serve's catch-all would answer 404 otherwise).
func getOnly(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			intake.WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed",
				fmt.Sprintf("%s is read with GET, not %s", r.URL.Path, r.Method))
			return
		}
		h(w, r)
	})
}

// cleanPaths serves next the requests whose path is clean, and answers
// one that is not (a doubled slash, a "." or ".." segment: a sender's URL
// joined badly) 308 Permanent Redirect to the clean path, which keeps the
// method and the body, with a JSON error that says what to fix. A sender
// that follows it is served there. net/http's ServeMux would answer 307
// with no body: a sender that does not follow redirects, or turns a
// redirected POST into a GET, logged an empty answer.
//
// The path is cleaned as sent, percent-encoding kept, as ServeMux does:
// an encoded slash or dot (/outbox/a%2F%2Fb) is part of a segment, not a
// separator. CONNECT and the request target "*" go through untouched, for
// ServeMux to answer as it does.
func cleanPaths(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent := r.URL.EscapedPath()
		clean := cleanPath(sent)
		if clean == sent || r.Method == http.MethodConnect || r.RequestURI == "*" {
			next.ServeHTTP(w, r)
			return
		}
		// Rooted and clean, clean never starts with "//": the Location
		// is a path on this server, never another host.
		to := clean
		if r.URL.RawQuery != "" {
			to += "?" + r.URL.RawQuery
		}
		if sent == "" {
			sent = "(empty)"
		}
		w.Header().Set("Location", to)
		intake.WriteError(w, http.StatusPermanentRedirect, "unclean_path", fmt.Sprintf(
			"the path %s is not clean: use %s (this answer redirects there, keeping the method and the body; better, correct the sender's URL)",
			sent, clean))
	})
}

// cleanPath is p as net/http's ServeMux cleans it: rooted, without "." or
// ".." segments or doubled slashes, its trailing slash kept.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np
}

// drainGate serves next until draining reports true; from then on every
// answer closes its connection, and new requests are answered 503 with
// Retry-After (/readyz: {"status":"draining"}), but those to the paths in
// own, which answer for themselves.
func drainGate(next http.Handler, draining func() bool, own ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !draining() {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Connection", "close")
		if slices.Contains(own, r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Retry-After", "5")
		if r.URL.Path == "/readyz" {
			writeJSONStatus(w, http.StatusServiceUnavailable, "draining")
			return
		}
		intake.WriteError(w, http.StatusServiceUnavailable, "draining", "the server is shutting down; retry shortly")
	})
}

// openConns counts a server's open connections (its ConnState hook), so
// that the drain at shutdown ends as soon as the last one has closed.
type openConns struct {
	mu   sync.Mutex
	n    int
	none chan struct{} // closed while n is 0
}

func newOpenConns() *openConns {
	c := &openConns{none: make(chan struct{})}
	close(c.none)
	return c
}

// track is the http.Server's ConnState hook.
func (c *openConns) track(_ net.Conn, state http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch state {
	case http.StateNew:
		if c.n == 0 {
			c.none = make(chan struct{})
		}
		c.n++
	case http.StateHijacked, http.StateClosed:
		c.n--
		if c.n == 0 {
			close(c.none)
		}
	}
}

// allClosed is closed once no connection is open.
func (c *openConns) allClosed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.none
}

func writeJSONStatus(w http.ResponseWriter, code int, status string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	fmt.Fprintf(w, "{\"status\":%q}\n", status)
}

// wakingStore is the store as serve's jobs write to it: each emit that
// queues outbox rows wakes their targets' delivery workers once it has
// committed, so that what a sync or a reconcile finds is delivered at once
// rather than at the dispatcher's next poll.
type wakingStore struct {
	*store.DB
	wake func(target string)
}

// EmitPage is store.DB's, then wakes the targets it queued rows for.
func (s wakingStore) EmitPage(ctx context.Context, events []backstop.Event, routes []backstop.Route, cur backstop.Cursor) ([]backstop.EmitResult, error) {
	res, err := s.DB.EmitPage(ctx, events, routes, cur)
	if err == nil {
		backstop.QueuedTargets(events, res, routes, s.wake)
	}
	return res, err
}

// EmitPageAt is store.DB's, then, unless the page was refused because its
// cursor was reset, wakes the targets it queued rows for.
func (s wakingStore) EmitPageAt(ctx context.Context, gen int64, events []backstop.Event, routes []backstop.Route, cur backstop.Cursor) ([]backstop.EmitResult, bool, error) {
	res, reset, err := s.DB.EmitPageAt(ctx, gen, events, routes, cur)
	if err == nil && !reset {
		backstop.QueuedTargets(events, res, routes, s.wake)
	}
	return res, reset, err
}

// ApplyEmitPageAt is store.DB's, then, unless the page was refused
// because its cursor was reset, wakes the targets it queued rows for.
func (s wakingStore) ApplyEmitPageAt(ctx context.Context, gen int64, silent []backstop.Object, events []backstop.Event, routes []backstop.Route, cur backstop.Cursor) (backstop.ApplyResult, []backstop.EmitResult, bool, error) {
	applied, res, reset, err := s.DB.ApplyEmitPageAt(ctx, gen, silent, events, routes, cur)
	if err == nil && !reset {
		backstop.QueuedTargets(events, res, routes, s.wake)
	}
	return applied, res, reset, err
}

// Emit is store.DB's, then wakes the targets it queued rows for.
func (s wakingStore) Emit(ctx context.Context, events []backstop.Event, routes []backstop.Route) ([]backstop.EmitResult, error) {
	res, err := s.DB.Emit(ctx, events, routes)
	if err == nil {
		backstop.QueuedTargets(events, res, routes, s.wake)
	}
	return res, err
}

// wakingStore takes the place of the store in each of the engine's roles.
var (
	_ backstop.Mirror        = wakingStore{}
	_ bsync.GuardedPageStore = wakingStore{}
	_ bsync.QuietPageStore   = wakingStore{}
	_ bsync.ChangedEmitter   = wakingStore{}
)

// EmitChanged is store.DB's, then wakes the targets it queued rows for.
func (s wakingStore) EmitChanged(ctx context.Context, events []backstop.Event, routes []backstop.Route) ([]backstop.EmitResult, error) {
	res, err := s.DB.EmitChanged(ctx, events, routes)
	if err == nil {
		backstop.QueuedTargets(events, res, routes, s.wake)
	}
	return res, err
}

// warnUnconfiguredTargets logs a warning for each target that is not in
// the configuration (removed or renamed) but still has queued or
// dead-letter deliveries: no worker sends them, and nothing else would say
// so.
func warnUnconfiguredTargets(ctx context.Context, db *store.DB, targets []config.Target, log *slog.Logger) error {
	names := make([]string, len(targets))
	for i, t := range targets {
		names[i] = t.Name
	}
	gone, err := db.UnconfiguredTargets(ctx, names)
	if err != nil {
		return err
	}
	for _, s := range gone {
		if s.Pending+s.Retrying+s.DeadLetter == 0 {
			continue // only delivered history: nothing is stranded
		}
		log.Warn(fmt.Sprintf("target %s is not in the configuration but has %d queued and %d dead-letter deliveries, which are never sent: "+
			"add it back to targets, or delete them with: backstop deliveries purge --target %s", s.Name, s.Pending+s.Retrying, s.DeadLetter, s.Name),
			"target", s.Name, "pending", s.Pending, "retrying", s.Retrying, "dead_letter", s.DeadLetter)
	}
	return nil
}

// withCause is msg followed by store.Cause(err) in parentheses, when err
// is one of the conditions it names.
func withCause(msg string, err error) string {
	if c := store.Cause(err); c != "" {
		return msg + " (" + c + ")"
	}
	return msg
}

// cachedProbe runs a check at most once every so often and answers the
// calls in between with its last result.
type cachedProbe struct {
	every time.Duration
	mu    sync.Mutex
	at    time.Time
	err   error
}

// check returns probe's result, run now or within the last c.every.
func (c *cachedProbe) check(ctx context.Context, probe func(context.Context) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() || time.Since(c.at) >= c.every {
		c.err, c.at = probe(ctx), time.Now()
	}
	return c.err
}

// parseHop reads one X-Forwarded-For entry: an address, bracketed or not,
// and perhaps with the port the proxy saw (Azure Application Gateway
// writes "203.0.113.5:61234"; RFC 7239 style "[2001:db8::1]:443").
func parseHop(s string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a, nil
	}
	if host, port, err := net.SplitHostPort(s); err == nil {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return netip.Addr{}, fmt.Errorf("X-Forwarded-For entry %q has no port number after its address", s)
		}
		return netip.ParseAddr(host) // ip:port, [ip]:port
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		return netip.ParseAddr(s[1 : len(s)-1])
	}
	return netip.Addr{}, fmt.Errorf("X-Forwarded-For entry %q is not an address", s)
}

// realClient serves next with each request's RemoteAddr set to the client
// its proxy names, when the request comes from a trusted proxy: the last
// address in X-Forwarded-For that is not itself a trusted proxy (each
// proxy appends the address it got the request from, so the entries to
// its left are the client's to write and are not believed). Requests from
// anywhere else keep their connection's address, X-Forwarded-For or not.
func realClient(next http.Handler, trusted []netip.Prefix) http.Handler {
	if len(trusted) == 0 {
		return next
	}
	isTrusted := func(a netip.Addr) bool {
		a = a.WithZone("").Unmap()
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		peer, perr := netip.ParseAddr(host)
		if err != nil || perr != nil || !isTrusted(peer) {
			next.ServeHTTP(w, r)
			return
		}
		var hops []string
		for _, v := range r.Header.Values("X-Forwarded-For") {
			hops = append(hops, strings.Split(v, ",")...)
		}
		for i := len(hops) - 1; i >= 0; i-- {
			a, err := parseHop(strings.TrimSpace(hops[i]))
			if err != nil {
				break // garbled: believe nothing to its left
			}
			if !isTrusted(a) {
				r2 := r.WithContext(r.Context()) // a copy
				r2.RemoteAddr = net.JoinHostPort(a.WithZone("").Unmap().String(), "0")
				next.ServeHTTP(w, r2)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
