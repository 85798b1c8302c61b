package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sinks/delivery"
	"github.com/backstop-sync/backstop/sinks/intake"
	"github.com/backstop-sync/backstop/sources"
	"github.com/backstop-sync/backstop/sources/governor"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
	bsync "github.com/backstop-sync/backstop/sync"
)

// demoOptions are the demo's flags.
type demoOptions struct {
	duration  time.Duration
	storePath string
	objects   int
	rate      float64
	seed      int64
}

// errDemoMismatch makes demo exit 1 when the check fails.
var errDemoMismatch = errors.New("demo: the mirror does not match the platform")

func (m *Main) demoCommand(g *globals) *cobra.Command {
	var o demoOptions
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Lose webhooks on purpose, then watch reconciliation find them (one process, no setup)",
		Long: `demo runs everything in one process, with nothing to configure: the platform
simulator, which loses 10% of its webhooks and duplicates and reorders some of
the rest; backstop's webhook intake receiving them; a backfill of the mirror
before the traffic starts; then --duration of live changes; then a
reconciliation of every resource that finds what the lost webhooks never said
(the check covers all four resources); and a local
recording target that the delivery dispatcher sends every queued event to.

It ends with a report and a computed check line, "mirror matches platform:
yes" or "no", and exits 1 when it is no. The database is a temporary file
unless --store names one, which must not exist yet.`,
		Args: cobraArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case o.duration <= 0:
				return usagef("--duration %s: want a positive duration", o.duration)
			case o.objects <= 0 || o.objects > sim.MaxObjects:
				return usagef("--objects %d: want 1 to %d", o.objects, sim.MaxObjects)
			case !(o.rate > 0 && o.rate <= sim.MaxMutationRate): // NaN too
				return usagef("--rate %g: want a number of changes per second, more than 0 and at most %d", o.rate, sim.MaxMutationRate)
			}
			// The report and the check line count what the database
			// holds, so a database of an earlier run (or a real mirror)
			// would skew them, and the demo would write the simulator's
			// objects into it.
			if o.storePath != "" {
				if _, err := os.Stat(o.storePath); err == nil {
					return usagef("--store %s: the file exists; the demo needs a new database (delete it or name another path)", o.storePath)
				}
				// As store.path's check says it (storeDirProblem).
				if fi, err := os.Stat(filepath.Dir(o.storePath)); err != nil {
					return usagef("--store %s: directory %s does not exist: create it, or give a path in an existing directory", o.storePath, filepath.Dir(o.storePath))
				} else if !fi.IsDir() {
					return usagef("--store %s: %s is not a directory", o.storePath, filepath.Dir(o.storePath))
				}
			}
			if !cmd.Flags().Changed("log-level") {
				g.logLevel = "warn" // the report is the output; --log-level info shows the steps
			}
			log, err := g.newLogger(m.Stderr)
			if err != nil {
				return err
			}
			return m.demo(cmd.Context(), log, o)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.duration, "duration", 20*time.Second, "how long the simulator makes changes")
	f.StringVar(&o.storePath, "store", "", "keep the database at this path, a new file (default: a temporary file)")
	f.IntVar(&o.objects, "objects", 2000, "objects per resource at the start")
	f.Float64Var(&o.rate, "rate", 60, "changes per second during the traffic phase")
	f.Int64Var(&o.seed, "seed", 1, "seed of the simulator's data and losses")
	return cmd
}

// demoWebhookRetries is the platform's retry schedule of a webhook answered
// non-2xx in the demo, compressed from hours to seconds (a variable for
// tests, which must keep webhooksIdleWait above its longest step).
var demoWebhookRetries = []time.Duration{250 * time.Millisecond, time.Second, 2 * time.Second}

// webhooksIdleWait is how long the demo waits for the platform's webhooks
// to end with no attempt made before it gives up on them (a variable for
// tests).
var webhooksIdleWait = 30 * time.Second

func (m *Main) demo(ctx context.Context, log *slog.Logger, o demoOptions) error {
	path, kept := o.storePath, "kept"
	if path == "" {
		kept = "temporary: removed at exit; --store PATH keeps it"
		dir, err := os.MkdirTemp("", "backstop-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		path = filepath.Join(dir, "demo.db")
	}
	db, err := store.Open(ctx, path, store.Options{Synchronous: "FULL"})
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	defer db.Close()

	// The intake listens first so the simulator knows where to send.
	intakeLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	secretBytes := make([]byte, 16)
	rand.Read(secretBytes)
	secret := hex.EncodeToString(secretBytes)
	platform := sim.New(sim.Options{
		Seed: o.seed, Objects: o.objects, MutationRate: o.rate,
		WebhookURL: "http://" + intakeLn.Addr().String() + "/webhooks/botix", WebhookSecret: secret,
		DropRate: 0.10, DuplicateRate: 0.05, ReorderRate: 0.05,
		RetrySchedule: demoWebhookRetries,
	})
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	apiSrv := &http.Server{Handler: platform.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go apiSrv.Serve(apiLn)
	defer apiSrv.Close()

	client, err := sources.New(sources.Options{
		BaseURL: "http://" + apiLn.Addr().String(), APIKey: platform.APIKey(), PageSize: 200,
		Governor: governor.New(platform.APIKey(), governor.Options{Logger: log.With("component", "governor")}), Logger: log,
	})
	if err != nil {
		return err
	}
	engine := &bsync.Engine{Source: client, Mirror: db, PageSize: 200, Logger: log.With("component", "engine")}
	verifier, err := intake.NewVerifier(intake.SchemeBotix, intake.SchemeOptions{Secrets: []string{secret}})
	if err != nil {
		return err
	}
	routes := []backstop.Route{{Target: "recorder", Events: []string{"*"}}}
	// The local recording target, fed by the real dispatcher.
	var recorded atomic.Int64
	recorderSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		recorded.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}), ReadHeaderTimeout: 5 * time.Second}
	recorderLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go recorderSrv.Serve(recorderLn)
	defer recorderSrv.Close()
	queue := newDeliveryQueue(db)
	dispatcher, err := delivery.New(queue, []delivery.Target{{
		Name: "recorder", URL: "http://" + recorderLn.Addr().String() + "/hooks", Secret: "whsec_" + base64.StdEncoding.EncodeToString(secretBytes),
		AllowPrivate: true, RetrySchedule: []time.Duration{100 * time.Millisecond, 500 * time.Millisecond},
	}}, delivery.Options{Logger: log, Poll: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	dispatchCtx, stopDispatch := context.WithCancel(ctx)
	dispatchDone := make(chan struct{})
	go func() { defer close(dispatchDone); dispatcher.Run(dispatchCtx) }()
	defer func() { stopDispatch(); <-dispatchDone }()
	stack := startIntake(ctx, db, client, verifier, intakeOptions{routes: routes, onQueued: dispatcher.Wake}, log, prometheus.NewRegistry())
	intakeSrv := &http.Server{Handler: stack.handler, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second}
	go intakeSrv.Serve(intakeLn)
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
		defer cancel()
		intakeSrv.Shutdown(sctx)
		stack.stop(sctx)
	}()

	out := m.Stdout
	fmt.Fprintf(out, "platform simulator at http://%s, webhook intake at http://%s, database %s (%s)\n",
		apiLn.Addr(), intakeLn.Addr(), path, kept)

	// 1. The mirror starts equal to the platform.
	fmt.Fprintf(out, "1. backfill: %d objects per resource ...\n", o.objects)
	stats, err := eachResource(ctx, backstop.Resources, func(ctx context.Context, r backstop.Resource) (backstop.RunStats, error) {
		return engine.Backfill(ctx, r, true)
	})
	if err != nil {
		return err
	}
	total := 0
	for _, s := range stats {
		total += s.Objects
	}
	fmt.Fprintf(out, "   %d objects mirrored\n", total)

	// 2. Live traffic: changes, each announced by a webhook that may be
	// lost, duplicated or reordered.
	fmt.Fprintf(out, "2. traffic: %.0f changes/s for %s; the platform loses 10%% of its webhooks ...\n", o.rate, o.duration)
	tctx, stop := context.WithTimeout(ctx, o.duration)
	ticker := time.NewTicker(5 * time.Second)
	runDone := make(chan struct{})
	// The sender is started first, for ctx: it outlives the traffic phase so
	// the platform's retries finish. Run would otherwise start it for tctx
	// and stop it, retries pending, when the traffic ends.
	platform.StartWebhooks(ctx)
	go func() { defer close(runDone); platform.Run(tctx) }()
	for waiting := true; waiting; {
		select {
		case <-runDone:
			waiting = false
		case <-ticker.C:
			ws := platform.WebhookStats()
			fmt.Fprintf(out, "   %d changes, %d webhooks delivered, %d lost\n", ws.Events, ws.Delivered, ws.Dropped)
		}
	}
	ticker.Stop()
	stop()
	if err := ctx.Err(); err != nil {
		return err
	}
	// The platform's webhooks end once the intake has taken them all, and
	// a backlog (a --rate above what the intake takes on this machine)
	// takes as long as it needs: the wait gives up only after
	// webhooksIdleWait in which no attempt was made.
	for last := platform.WebhookStats().Attempts; ; {
		idle, cancelIdle := context.WithTimeout(ctx, webhooksIdleWait)
		err = platform.WebhooksIdle(idle)
		cancelIdle()
		if err == nil {
			break
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		ws := platform.WebhookStats()
		if !errors.Is(err, context.DeadlineExceeded) || ws.Attempts == last {
			return fmt.Errorf("waiting for the platform's webhook retries: %w", err)
		}
		fmt.Fprintf(out, "   %d changes, %d webhooks delivered, %d lost (the intake is still taking them)\n", ws.Events, ws.Delivered, ws.Dropped)
		last = ws.Attempts
	}
	behindBefore, err := mirrorDiffAll(ctx, db, platform)
	if err != nil {
		return err
	}

	// 3. Reconciliation finds what the lost webhooks never said, for every
	// resource (the hourly payments job does one of these).
	fmt.Fprintln(out, "3. reconcile every resource ...")
	var rep backstop.ReconcileReport
	for _, r := range backstop.Resources {
		one, err := engine.Reconcile(ctx, r, bsync.ReconcileOptions{Full: true, Routes: routes})
		if err != nil {
			return err
		}
		rep.Scanned += one.Scanned
		rep.Missing += one.Missing
		rep.Behind += one.Behind
		rep.Reemitted += one.Reemitted
		rep.Suppressed += one.Suppressed
	}
	behindAfter, err := mirrorDiffAll(ctx, db, platform)
	if err != nil {
		return err
	}
	origins, err := db.ProcessedByOrigin(ctx)
	if err != nil {
		return err
	}
	queued, err := db.OutboxRows(ctx, "recorder")
	if err != nil {
		return err
	}
	// Let the dispatcher send everything queued to the recording target.
	deadline := time.Now().Add(30 * time.Second)
	var state store.TargetState
	for {
		states, err := db.TargetStates(ctx, []string{"recorder"})
		if err != nil {
			return err
		}
		state = states[0]
		if state.Pending+state.Retrying == 0 || time.Now().After(deadline) {
			break
		}
		dispatcher.Wake("recorder")
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	ws := platform.WebhookStats()
	// Every 2xx the platform got was an accepted event or a duplicate.
	answered := 0
	for _, a := range platform.WebhookLog() {
		if a.Status >= 200 && a.Status < 300 {
			answered++
		}
	}
	dups := answered - origins[backstop.OriginWebhook]

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nreport\t")
	fmt.Fprintf(tw, "  changes made by the platform\t%d\n", ws.Events)
	fmt.Fprintf(tw, "  webhooks lost (never sent)\t%d\n", ws.Dropped)
	fmt.Fprintf(tw, "  webhooks duplicated / reordered\t%d / %d\n", ws.Duplicated, ws.Reordered)
	fmt.Fprintf(tw, "  events accepted from webhooks\t%d\n", origins[backstop.OriginWebhook])
	fmt.Fprintf(tw, "  duplicate webhooks suppressed\t%d\n", dups)
	fmt.Fprintf(tw, "  objects behind before reconcile\t%d\n", behindBefore)
	fmt.Fprintf(tw, "  reconcile: scanned / missing / behind\t%d / %d / %d\n", rep.Scanned, rep.Missing, rep.Behind)
	fmt.Fprintf(tw, "  reconcile: re-emitted / suppressed\t%d / %d\n", rep.Reemitted, rep.Suppressed)
	fmt.Fprintf(tw, "  events queued for delivery (outbox)\t%d\n", len(queued))
	fmt.Fprintf(tw, "  deliveries recorded by the local target\t%d (delivered %d, dead %d, still queued %d)\n",
		recorded.Load(), state.Delivered, state.DeadLetter, state.Pending+state.Retrying)
	tw.Flush()
	match := behindAfter == 0
	fmt.Fprintf(out, "mirror matches platform: %s\n", yesNo(match))
	if !match {
		return fmt.Errorf("%w: %d objects differ after reconcile", errDemoMismatch, behindAfter)
	}
	return nil
}

// mirrorDiffAll is mirrorDiff summed over every resource.
func mirrorDiffAll(ctx context.Context, db *store.DB, platform *sim.Sim) (int, error) {
	total := 0
	for _, r := range backstop.Resources {
		n, err := mirrorDiff(ctx, db, platform, r)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// mirrorDiff counts the platform's objects of r whose current version the
// mirror does not hold byte for byte (missing or behind).
func mirrorDiff(ctx context.Context, db *store.DB, platform *sim.Sim, r backstop.Resource) (int, error) {
	diff := 0
	for _, want := range platform.Objects(r) {
		got, ok, err := db.Get(ctx, r, want.ID)
		if err != nil {
			return 0, err
		}
		if !ok || !got.UpdatedAt.Equal(want.UpdatedAt) || !bytes.Equal(got.Data, want.Data) {
			diff++
		}
	}
	return diff, nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
