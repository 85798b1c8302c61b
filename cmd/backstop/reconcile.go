package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/cmd/backstop/config"
	bsync "github.com/backstop-sync/backstop/sync"
)

func (m *Main) reconcileCommand(g *globals) *cobra.Command {
	var (
		since          string
		full, dry, asJ bool
	)
	cmd := &cobra.Command{
		Use:   "reconcile [RESOURCE...]",
		Short: "Compare the platform with the mirror and re-emit every missed event",
		Long: `reconcile pages the platform's feed over a window and compares each object with
the mirror: an object missing locally or newer upstream is emitted as the event
of its current state: payment.<status> and chat.<status> (a chat already closed
is chat.closed), contact.created or message.created when missing and
contact.updated or message.updated when behind. Everything goes through the same emit path
as the webhook intake, so the dedup decides once, whoever saw the event first.
It reads one page at a time and never moves a cursor.

Reconciliation restores the latest state, not history: if an object changed
twice between runs, only its current version is re-emitted.

The window is --since (a duration such as 2h, an RFC 3339 time or a date), or --full
for the whole feed (which also counts orphans: mirror objects the platform no
longer returns), or by default the start of the last successful reconcile of
that resource minus 10m, or the last 24h on a first run. A run whose --since
began after the previous run's start (or in the future) left time unread, so
it does not move the default window: the next default run starts before the
gap.

On a terminal it draws a progress bar per resource; otherwise it logs a
progress line per resource every 5 seconds and a line when each ends.`,
		Example: "  backstop reconcile payments\n  backstop reconcile --since 6h --dry-run --json",
		RunE: func(cmd *cobra.Command, args []string) error {
			resources, err := backstop.ParseResources(args)
			if err != nil {
				return usageError{err}
			}
			var sinceT time.Time
			if since != "" {
				if full {
					return usagef("--since and --full exclude each other")
				}
				if sinceT, err = parseSince(since, time.Now()); errors.Is(err, errSinceBefore1970) {
					return usagef("%v, or --full to compare the whole feed", err)
				} else if err != nil {
					return usageError{err}
				}
			}
			ctx := cmd.Context()
			prog := newProgress(m, "reconcile", resources)
			a, err := m.openApp(ctx, g, prog.out)
			if err != nil {
				prog.abort()
				return err
			}
			defer a.Close()
			prog.start(a.log)
			opts := bsync.ReconcileOptions{Since: sinceT, Full: full, DryRun: dry, Routes: routesOf(a.cfg),
				OnPage: prog.reconcilePage}
			reports, runErr := eachResource(ctx, resources, func(ctx context.Context, r backstop.Resource) (backstop.ReconcileReport, error) {
				rep, err := a.engine.Reconcile(ctx, r, opts)
				err = stoppedByRefusedKey(ctx, err)
				rep.Resource, rep.Err = r, err
				prog.reconcileFinish(rep)
				return rep, err
			})
			prog.wait()
			if err := printReconcile(m.Stdout, reports, asJ); err != nil {
				return err
			}
			return runErr
		},
	}
	f := cmd.Flags()
	f.StringVar(&since, "since", "", "start of the window: a duration back from now (2h, 3d, 1d12h), an RFC 3339 time or a date (UTC)")
	f.BoolVar(&full, "full", false, "compare the whole feed and count orphans")
	f.BoolVar(&dry, "dry-run", false, "compare and report, emit nothing")
	f.BoolVar(&asJ, "json", false, "print the report as JSON")
	return cmd
}

// parseSince reads --since: a duration back from now, an RFC 3339 time,
// or a date (its start, UTC).
// A time before 1970 is refused (errSinceBefore1970): no platform's feed
// reaches back that far, and the platform refuses such a since with a 400.
func parseSince(s string, now time.Time) (time.Time, error) {
	t, ok := parseSinceForms(s, now)
	if !ok {
		return time.Time{}, fmt.Errorf("--since %q: want a duration such as 2h or 3d, an RFC 3339 time or a date (2026-01-31)", s)
	}
	if t.Before(time.Unix(0, 0)) {
		return time.Time{}, fmt.Errorf("--since %q: %w", s, errSinceBefore1970)
	}
	return t, nil
}

// errSinceBefore1970 is parseSince's error for a time before 1970.
var errSinceBefore1970 = errors.New("reaches back before 1970-01-01: give a later time")

// parseSinceForms is parseSince without the bound.
func parseSinceForms(s string, now time.Time) (time.Time, bool) {
	if t, err := backstop.ParseTime(s); err == nil {
		return t, true
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, true
	}
	// As in the configuration: "2h", "3d", "1d12h" (a day is 24 hours,
	// not a calendar day: across a change of summer time in a local zone
	// "3d" is an hour more or less than three days by the clock).
	if d, err := config.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-time.Duration(d)), true
	}
	// Only a day count past what a time.Duration holds (106,751 days)
	// gets here: it reaches before 1970, which parseSince refuses with
	// that reason rather than as a malformed value.
	var days int
	if n, err := fmt.Sscanf(s, "%dd", &days); err == nil && n == 1 && days > 0 && fmt.Sprintf("%dd", days) == s {
		if days > 100_000 {
			// Centuries back, before 1970 for parseSince; AddDate
			// would overflow into the future.
			return time.Time{}, true
		}
		return now.AddDate(0, 0, -days), true
	}
	return time.Time{}, false
}

// orphanCount is r's orphan count, or nil when r did not count them:
// orphans are counted at the end of a full run, so a run that is not full
// or did not get there has no count, not a count of 0.
func orphanCount(r backstop.ReconcileReport) *int {
	if !r.Full || r.Err != nil {
		return nil
	}
	n := r.Orphans
	return &n
}

func printReconcile(w io.Writer, reports []backstop.ReconcileReport, asJSON bool) error {
	if asJSON {
		type row struct {
			Resource    string  `json:"resource"`
			Since       string  `json:"since,omitempty"`
			Full        bool    `json:"full"`
			DryRun      bool    `json:"dry_run"`
			Scanned     int     `json:"scanned"`
			Missing     int     `json:"missing"`
			Behind      int     `json:"behind"`
			Reemitted   int     `json:"reemitted"`
			Suppressed  int     `json:"suppressed"`
			Orphans     *int    `json:"orphans"` // null: not counted (see orphanCount)
			Requests    int     `json:"requests"`
			RateLimited int     `json:"rate_limited"`
			DurationS   float64 `json:"duration_seconds"`
			Result      string  `json:"result"`
			Error       string  `json:"error,omitempty"`
		}
		rows := make([]row, 0, len(reports))
		for _, r := range reports {
			x := row{Resource: string(r.Resource), Full: r.Full, DryRun: r.DryRun, Scanned: r.Scanned,
				Missing: r.Missing, Behind: r.Behind, Reemitted: r.Reemitted, Suppressed: r.Suppressed,
				Orphans: orphanCount(r), Requests: r.Requests, RateLimited: r.RateLimited,
				DurationS: r.Duration.Seconds(), Result: result(r.Err)}
			if !r.Since.IsZero() {
				x.Since = r.Since.UTC().Format(time.RFC3339)
			}
			if r.Err != nil {
				x.Error = r.Err.Error()
			}
			rows = append(rows, x)
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "RESOURCE\tSINCE\tSCANNED\tMISSING\tBEHIND\tRE-EMITTED\tSUPPRESSED\tORPHANS\tREQUESTS\t429s\tDURATION\tRESULT\t")
	for _, r := range reports {
		since := "start"
		if !r.Since.IsZero() {
			since = r.Since.UTC().Format(time.RFC3339)
		}
		orphans := "-"
		if n := orphanCount(r); n != nil {
			orphans = fmt.Sprint(*n)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%s\t%s\t\n", r.Resource, since, r.Scanned, r.Missing,
			r.Behind, r.Reemitted, r.Suppressed, orphans, r.Requests, r.RateLimited, round(r.Duration), result(r.Err))
	}
	return tw.Flush()
}
