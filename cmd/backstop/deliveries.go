package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/cmd/backstop/config"
	"github.com/backstop-sync/backstop/sinks/delivery"
	"github.com/backstop-sync/backstop/store"
)

func (m *Main) deliveriesCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "deliveries",
		Short: "Inspect and steer outbound deliveries (list, show, retry, redirect, purge, targets)",
		Long: `deliveries works on the outbox: one row per event and target, delivered by
serve with a retry schedule, then dead-lettered. Each attempt is logged with its
URL, status, error, the first 4 KiB of the answer, request id and duration.`,
		// Runnable, so that a mistyped subcommand is an unknown command
		// (exit 2) rather than this help and exit 0.
		Args: cobraArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(
		m.deliveriesListCommand(g),
		m.deliveriesShowCommand(g),
		m.deliveriesRetryCommand(g),
		m.deliveriesRedirectCommand(g),
		m.deliveriesPurgeCommand(g),
		m.targetsCommand(g),
	)
	return cmd
}

func (m *Main) deliveriesListCommand(g *globals) *cobra.Command {
	var (
		f      store.DeliveryFilter
		since  string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List deliveries, newest first",
		Args:  cobraArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch f.Status {
			case "", "pending", "retrying", "delivered", "dead_letter":
			default:
				return usagef("--status %q: want pending, retrying, delivered or dead_letter", f.Status)
			}
			if f.Limit < 1 {
				return usagef("--limit %d: want 1 or more rows", f.Limit)
			}
			if _, err := path.Match(f.EventType, ""); err != nil {
				return usagef("--event %q: %v (want an event type, or a glob such as contact.*)", f.EventType, err)
			}
			if since != "" {
				t, err := parseSince(since, time.Now())
				if err != nil {
					return usageError{err}
				}
				f.Since = t
			}
			db, cfg, err := m.openStore(cmd.Context(), g)
			if err != nil {
				return err
			}
			defer db.Close()
			// One more than asked for, to tell a list cut at --limit from
			// a whole one.
			limit := f.Limit
			f.Limit++
			rows, err := db.Deliveries(cmd.Context(), f)
			if err != nil {
				return err
			}
			more := len(rows) > limit
			if more {
				rows = rows[:limit]
				// On stderr: the list (or its JSON) on stdout stays whole.
				defer fmt.Fprintf(m.Stderr, "only the newest %d shown: more deliveries match (raise --limit, or narrow with --status, --target, --event, --since)\n", limit)
			}
			when, err := queuedTargets(cmd.Context(), db, cfg, rows)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSONOut(m.Stdout, when.rows(rows))
			}
			if len(rows) == 0 {
				if f.Target != "" && !hasTarget(cfg.Targets, f.Target) {
					// Not an error: a target since removed from the
					// configuration may still have rows.
					_, err := fmt.Fprintf(m.Stdout, "no deliveries match (and the configuration has no target %q)\n", f.Target)
					return err
				}
				_, err := fmt.Fprintln(m.Stdout, "no deliveries match")
				return err
			}
			tw := tabwriter.NewWriter(m.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTARGET\tEVENT\tEVENT ID\tSTATUS\tATTEMPTS\tLAST\tNEXT ATTEMPT\tCREATED")
			for _, r := range rows {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.ID, r.Target, r.EventType, eventIDOf(r), r.Status,
					r.Attempts, lastOutcome(r), when.next(r), r.CreatedAt.UTC().Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.Status, "status", "", "pending, retrying, delivered or dead_letter")
	fl.StringVar(&f.Target, "target", "", "only this target")
	fl.StringVar(&f.EventType, "event", "", "only this event type, or those a glob matches as a target's events do (\"contact.*\")")
	// No default window: the rows kept longest are those still queued (a
	// disabled target's) and the dead letters, which a window would hide;
	// delivered rows are pruned after 14 days anyway.
	fl.StringVar(&since, "since", "", "only deliveries created since: a duration back (14d, 2h), an RFC 3339 time or a date (default: every one kept)")
	fl.IntVar(&f.Limit, "limit", 100, "at most this many rows")
	fl.BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

func (m *Main) deliveriesShowCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show one delivery: its payload and every attempt",
		Args:  oneArg("the delivery's id, as backstop deliveries list shows it"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			db, cfg, err := m.openStore(cmd.Context(), g)
			if err != nil {
				return err
			}
			defer db.Close()
			row, ok, err := db.Delivery(cmd.Context(), id)
			if err != nil {
				return err
			}
			if !ok {
				return noDelivery(id)
			}
			when, err := queuedTargets(cmd.Context(), db, cfg, []store.OutboxRow{row})
			if err != nil {
				return err
			}
			attempts, err := db.Attempts(cmd.Context(), id)
			if err != nil {
				return err
			}
			// What the target is sent, when its max_payload cuts it.
			var sent json.RawMessage
			limit := delivery.DefaultMaxPayload
			for _, t := range cfg.Targets {
				if t.Name == row.Target && t.MaxPayload > 0 {
					limit = t.MaxPayload
				}
			}
			if b := delivery.SentBody(row, limit); !bytes.Equal(b, row.Payload) {
				sent = b
			}
			if asJSON {
				return writeJSONOut(m.Stdout, struct {
					Delivery deliveryRow  `json:"delivery"`
					Payload  any          `json:"payload"`
					Sent     any          `json:"sent_payload,omitempty"` // what the target gets, when cut
					Attempts []attemptRow `json:"attempts"`
				}{when.rows([]store.OutboxRow{row})[0], json.RawMessage(row.Payload), omitNil(sent), attemptRows(attempts)})
			}
			w := m.Stdout
			what := "event"
			if row.Proxied {
				what = "proxied payload" // its event id is the caller's X-Event-Id
			}
			fmt.Fprintf(w, "delivery %d  target %s  %s %s (%s)\nstatus %s  attempts %d  next attempt %s\n\npayload:\n",
				row.ID, row.Target, what, row.EventID, row.EventType, row.Status, row.Attempts, when.next(row))
			// Indented as stored: the keys keep the order the target gets.
			var pretty bytes.Buffer
			if json.Indent(&pretty, row.Payload, "  ", "  ") != nil {
				pretty.Reset()
				pretty.Write(row.Payload)
			}
			fmt.Fprintf(w, "  %s\n", pretty.Bytes())
			if sent != nil {
				pretty.Reset()
				if json.Indent(&pretty, sent, "  ", "  ") != nil {
					pretty.Reset()
					pretty.Write(sent)
				}
				fmt.Fprintf(w, "\nsent to %s cut to fit its max_payload of %d bytes (the payload is %d): data as its id alone, and \"truncated\": true:\n  %s\n",
					row.Target, limit, len(row.Payload), pretty.Bytes())
			}
			fmt.Fprintln(w, "\nattempts:")
			switch {
			case len(attempts) == 0 && row.Attempts > 0:
				// Pruned after 14 days (maintenance), dead letters' too.
				n := fmt.Sprintf("%d attempts", row.Attempts)
				if row.Attempts == 1 {
					n = "attempt"
				}
				fmt.Fprintf(w, "  none kept: the log of its %s was pruned (attempts are kept 14 days); its last answer: %s\n",
					n, lastOutcome(row))
			case len(attempts) == 0:
				fmt.Fprintln(w, "  none yet")
			}
			for _, a := range attempts {
				kind := ""
				if a.Redirect {
					kind = " (redirect)"
				}
				fmt.Fprintf(w, "  #%d%s %s %s  status %s  %s  request %s\n", a.Attempt, kind, a.At.UTC().Format(time.RFC3339),
					a.URL, statusOrDash(a.StatusCode), round(a.Duration), a.RequestID)
				if a.Error != "" {
					fmt.Fprintf(w, "     error: %s\n", a.Error)
				}
				if a.Body != "" {
					fmt.Fprintf(w, "     body: %s\n", oneLine(a.Body, 300))
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

func (m *Main) deliveriesRetryCommand(g *globals) *cobra.Command {
	var (
		dead   bool
		target string
	)
	cmd := &cobra.Command{
		Use:   "retry [ID | --dead --target T]",
		Short: "Queue a delivery (or every dead letter of a target) to be sent again",
		Long: `retry puts a delivery back in its target's queue with a fresh retry schedule:
the same event id, a new request id on the next attempt. With --dead --target
it does that for every dead letter of the target. A running serve sends them
within a second or so, unless their target is disabled (after a 410 answer:
nothing is sent until deliveries targets enable NAME) or paused (after a 429:
not before the pause ends); retry says so when it is.`,
		Args: cobraArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if dead == (len(args) == 1) {
				return usagef("give a delivery ID, or --dead --target T")
			}
			if dead && target == "" {
				return usagef("--dead needs --target: the target whose dead letters to queue again")
			}
			if !dead && target != "" {
				// Not a filter on the ID: it would be ignored.
				return usagef("--target goes with --dead (every dead letter of the target); to retry delivery %s alone, give no --target", args[0])
			}
			db, cfg, err := m.openStore(cmd.Context(), g)
			if err != nil {
				return err
			}
			defer db.Close()
			now := time.Now()
			if dead {
				if !hasTarget(cfg.Targets, target) {
					return usagef("--target %q: no such target in the configuration (to delete the deliveries of a removed target: backstop deliveries purge --target %s)", target, target)
				}
				n, err := db.RetryDead(cmd.Context(), target, now)
				if err != nil {
					return err
				}
				if _, err = fmt.Fprintf(m.Stdout, "%d dead letters of %s queued again\n", n, target); err != nil || n == 0 {
					return err
				}
				return m.sayWhenSent(cmd.Context(), db, target, now, false)
			}
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			row, ok, err := db.Delivery(cmd.Context(), id)
			if err != nil {
				return err
			}
			if !ok {
				return noDelivery(id)
			}
			if !hasTarget(cfg.Targets, row.Target) {
				// No worker serves it: "queued again" would be a promise
				// never kept.
				return usagef("delivery %d is for target %q, which is not in the configuration: it would never be sent; "+
					"add the target back to targets, or delete its deliveries with: backstop deliveries purge --target %s",
					id, row.Target, row.Target)
			}
			if err := db.RetryDelivery(cmd.Context(), id, now); errors.Is(err, backstop.ErrNotFound) {
				return noDelivery(id)
			} else if fl := (*backstop.InFlightError)(nil); errors.As(err, &fl) {
				return fmt.Errorf("delivery %d is claimed for sending to %s (its attempt is in flight, or waits for a free slot "+
					"or for a 429's pause to end), so nothing was queued: that would send it twice. Its outcome is recorded "+
					"when the attempt ends; if it still needs one, retry it then (it is claimed until %s at the latest). "+
					"See it with: backstop deliveries show %d",
					id, row.Target, fl.Until.Local().Format(time.RFC3339), id)
			} else if err != nil {
				return err
			}
			if _, err = fmt.Fprintf(m.Stdout, "delivery %d queued again\n", id); err != nil {
				return err
			}
			return m.sayWhenSent(cmd.Context(), db, row.Target, now, true)
		},
	}
	cmd.Flags().BoolVar(&dead, "dead", false, "every dead letter of --target")
	cmd.Flags().StringVar(&target, "target", "", "the target, with --dead")
	return cmd
}

func (m *Main) deliveriesPurgeCommand(g *globals) *cobra.Command {
	var (
		dead   bool
		before string
		target string
	)
	cmd := &cobra.Command{
		Use:   "purge (--dead --before D | --target T)",
		Short: "Delete old dead letters, or every delivery of a target removed from the configuration",
		Long: `purge --dead --before D deletes the dead letters last changed before D (a
duration back such as 30d, an RFC 3339 time or a date), with their attempts; dead
letters are otherwise kept until retried.

purge --target T deletes every delivery of T, whatever its status (pending,
retrying, delivered, dead letter), with its attempts, for a target that is no
longer in the configuration (removed or renamed): no worker sends its queued
deliveries, and serve warns of them at start. deliveries targets lists such
targets. For a target still in the configuration it is refused: its queued
deliveries are still sent; retry or purge --dead its dead letters instead.`,
		Args: cobraArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if target != "" {
				if dead || before != "" {
					return usagef("--target deletes every delivery of a removed target: give it without --dead and --before")
				}
				return m.purgeTarget(cmd.Context(), g, target)
			}
			if !dead || before == "" {
				return usagef("purge needs --dead and --before (a duration back such as 30d, an RFC 3339 time or a date), or --target T for a target removed from the configuration")
			}
			now := time.Now()
			t, err := parseSince(before, now)
			if err != nil {
				return usagef("--before %q: want a duration back such as 30d or 12h, an RFC 3339 time or a date (2026-01-31)", before)
			}
			// Most likely a typo (2099 for 2019), and every dead letter
			// would go: a minute of clock skew is let through.
			if t.After(now.Add(time.Minute)) {
				return usagef("--before %s is in the future, which would purge every dead letter: check the date, or give --before 1s to purge them all", before)
			}
			db, _, err := m.openStore(cmd.Context(), g)
			if err != nil {
				return err
			}
			defer db.Close()
			n, err := db.PurgeDead(cmd.Context(), t)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(m.Stdout, "%d dead letters from before %s purged\n", n, t.UTC().Format(time.RFC3339))
			return err
		},
	}
	cmd.Flags().BoolVar(&dead, "dead", false, "purge dead letters")
	cmd.Flags().StringVar(&before, "before", "", "only those last changed before this (30d, an RFC 3339 time or a date)")
	cmd.Flags().StringVar(&target, "target", "", "delete every delivery of this target, which must not be in the configuration")
	return cmd
}

// sayWhenSent tells, after deliveries of target were queued again, when
// they are not sent at once: while the target is disabled (after a 410)
// nothing is sent until it is enabled, and while it is paused (after a 429)
// not before the pause ends.
// one says it of a single delivery.
func (m *Main) sayWhenSent(ctx context.Context, db *store.DB, target string, now time.Time, one bool) error {
	st, err := db.TargetQueue(ctx, target, false)
	if err != nil {
		return err
	}
	switch {
	case st.Disabled:
		_, err = fmt.Fprintf(m.Stdout, "but target %s is disabled (%s): nothing is sent to it until it is enabled: backstop deliveries targets enable %s\n",
			target, st.DisabledReason, target)
	case st.PausedUntil.After(now):
		what := "they are"
		if one {
			what = "it is"
		}
		_, err = fmt.Fprintf(m.Stdout, "target %s is paused until %s (it answered 429): %s sent then\n",
			target, st.PausedUntil.UTC().Format(time.RFC3339), what)
	}
	return err
}

// purgeTarget deletes every delivery of target, refusing a target that is
// in the configuration.
func (m *Main) purgeTarget(ctx context.Context, g *globals, target string) error {
	db, cfg, err := m.openStore(ctx, g)
	if err != nil {
		return err
	}
	defer db.Close()
	if hasTarget(cfg.Targets, target) {
		return usagef("target %q is in the configuration, so its queued deliveries are still sent: purge --target only deletes those of a target removed from it; "+
			"for its dead letters use deliveries retry --dead --target %s, or purge --dead --before D", target, target)
	}
	n, err := db.PurgeTarget(ctx, target)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(m.Stdout, "%d deliveries of %s (not in the configuration) purged, with their attempts\n", n, target)
	return err
}

func (m *Main) targetsCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "targets",
		Short: "Show each target's state: queue depth, dead letters, paused until, disabled",
		Args:  cobraArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			db, cfg, err := m.openStore(cmd.Context(), g)
			if err != nil {
				return err
			}
			defer db.Close()
			names := make([]string, len(cfg.Targets))
			for i, t := range cfg.Targets {
				names[i] = t.Name
			}
			states, err := db.TargetStates(cmd.Context(), names)
			if err != nil {
				return err
			}
			// Targets removed from (or renamed in) the configuration whose
			// rows are still kept: no worker sends them.
			gone, err := db.UnconfiguredTargets(cmd.Context(), names)
			if err != nil {
				return err
			}
			if asJSON {
				now := time.Now()
				out := make([]targetRow, 0, len(states)+len(gone))
				for _, s := range states {
					out = append(out, newTargetRow(s, true, now))
				}
				for _, s := range gone {
					out = append(out, newTargetRow(s, false, now))
				}
				return writeJSONOut(m.Stdout, out)
			}
			tw := tabwriter.NewWriter(m.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "TARGET\tPENDING\tRETRYING\tDELIVERED\tDEAD\tPAUSED UNTIL\tDISABLED")
			for _, s := range slices.Concat(states, gone) {
				name := s.Name
				if !hasTarget(cfg.Targets, name) {
					name += " (not in the configuration)"
				}
				disabled := "no"
				if s.Disabled {
					disabled = "yes: " + s.DisabledReason
				}
				paused := "-"
				if s.PausedUntil.After(time.Now()) {
					paused = s.PausedUntil.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\n", name, s.Pending, s.Retrying, s.Delivered, s.DeadLetter, paused, disabled)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if len(gone) > 0 {
				_, err = fmt.Fprintln(m.Stdout, "\nTargets not in the configuration are not sent to: add them back to targets, or delete their deliveries with backstop deliveries purge --target NAME.")
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	enable := &cobra.Command{
		Use:   "enable NAME",
		Short: "Enable a target that a 410 answer disabled (and lift any pause)",
		Long: `Enable a target that a 410 answer disabled, and lift the pause a 429
stored with it: a running serve sees it within a second or so, ends its
own pacing of the target after the 429 too (in Redis, for every serve,
with governor.redis), and sends to it again at once.`,
		Args: oneArg("the target's name, as backstop deliveries targets shows it"),
		RunE: func(cmd *cobra.Command, args []string) error {
			db, cfg, err := m.openStore(cmd.Context(), g)
			if err != nil {
				return err
			}
			defer db.Close()
			if !hasTarget(cfg.Targets, args[0]) {
				return usagef("no target %q in the configuration", args[0])
			}
			if err := db.EnableTarget(cmd.Context(), args[0]); err != nil {
				return err
			}
			_, err = fmt.Fprintf(m.Stdout, "target %s enabled\n", args[0])
			return err
		},
	}
	cmd.AddCommand(enable)
	return cmd
}

// targetRow is a target's state as deliveries targets --json prints it, in
// the snake_case of deliveries list --json. Configured is false for a
// target removed from (or renamed in) the configuration whose deliveries
// are still kept: they are never sent. PausedUntil is set only while the
// target is paused, DisabledReason and DisabledAt only while it is
// disabled.
type targetRow struct {
	Name           string     `json:"name"`
	Configured     bool       `json:"configured"`
	Pending        int        `json:"pending"`
	Retrying       int        `json:"retrying"`
	Delivered      int        `json:"delivered"`
	DeadLetter     int        `json:"dead_letter"`
	PausedUntil    *time.Time `json:"paused_until,omitempty"`
	Disabled       bool       `json:"disabled"`
	DisabledReason string     `json:"disabled_reason,omitempty"`
	DisabledAt     *time.Time `json:"disabled_at,omitempty"`
}

// newTargetRow is s as deliveries targets --json prints it at now.
func newTargetRow(s backstop.TargetState, configured bool, now time.Time) targetRow {
	r := targetRow{Name: s.Name, Configured: configured, Pending: s.Pending, Retrying: s.Retrying,
		Delivered: s.Delivered, DeadLetter: s.DeadLetter, Disabled: s.Disabled}
	if s.PausedUntil.After(now) {
		t := s.PausedUntil.UTC()
		r.PausedUntil = &t
	}
	if s.Disabled {
		r.DisabledReason = s.DisabledReason
		if !s.DisabledAt.IsZero() {
			t := s.DisabledAt.UTC()
			r.DisabledAt = &t
		}
	}
	return r
}

// eventIDOf is the EVENT ID column of deliveries list: the event's id, or
// a proxied payload's key (the caller's X-Event-Id) marked as such, since
// an event may have the same id.
func eventIDOf(r store.OutboxRow) string {
	if r.Proxied {
		return r.EventID + " (proxied)"
	}
	return r.EventID
}

// deliveryRow is a delivery as --json prints it.
type deliveryRow struct {
	ID            int64      `json:"id"`
	Target        string     `json:"target"`
	EventID       string     `json:"event_id"`
	EventType     string     `json:"event_type"`
	Proxied       bool       `json:"proxied,omitempty"`
	Status        string     `json:"status"`
	Attempts      int        `json:"attempts"`
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	// TargetPausedUntil is set on a queued row whose target is paused
	// (after a 429) past the row's own next attempt: it is sent then.
	TargetPausedUntil *time.Time `json:"target_paused_until,omitempty"`
	// TargetDisabled and TargetNotConfigured mark a queued row that is not
	// sent at all until its target is enabled or configured again.
	TargetDisabled      bool `json:"target_disabled,omitempty"`
	TargetNotConfigured bool `json:"target_not_configured,omitempty"`
	// ClaimedUntil is set on a queued row a dispatcher has claimed: it is
	// being sent (or waits for a free slot or a 429's pause) until then at
	// the latest, and a retry is refused meanwhile.
	ClaimedUntil *time.Time `json:"claimed_until,omitempty"`
	LastStatus   int        `json:"last_status,omitempty"`
	// LastError is the last failed attempt's error when the target gave
	// no answer (a refused connection, a timeout); LastResponse, when it
	// answered (LastStatus), the start of its answer's body.
	LastError    string    `json:"last_error,omitempty"`
	LastResponse string    `json:"last_response,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	UpdatedAt    time.Time `json:"updated_at"`
}

// targetsNow is what the targets of listed rows are doing now, for saying
// when a queued row is really attempted.
type targetsNow struct {
	now        time.Time
	states     map[string]store.TargetState
	configured map[string]bool
}

// queuedTargets reads the pause and disabled state of the targets of rows'
// queued rows (pending or retrying).
func queuedTargets(ctx context.Context, db *store.DB, cfg *config.Config, rows []store.OutboxRow) (targetsNow, error) {
	t := targetsNow{now: time.Now(), states: map[string]store.TargetState{}, configured: map[string]bool{}}
	for _, c := range cfg.Targets {
		t.configured[c.Name] = true
	}
	for _, r := range rows {
		if !queued(r) {
			continue
		}
		if _, ok := t.states[r.Target]; ok {
			continue
		}
		st, err := db.TargetQueue(ctx, r.Target, false)
		if err != nil {
			return t, err
		}
		t.states[r.Target] = st
	}
	return t, nil
}

func queued(r store.OutboxRow) bool { return r.Status == "pending" || r.Status == "retrying" }

// pausedPast returns the end of r's target's pause when r is queued and
// the pause ends after r's own next attempt (and after now).
func (t targetsNow) pausedPast(r store.OutboxRow) (time.Time, bool) {
	if !queued(r) {
		return time.Time{}, false
	}
	until := t.states[r.Target].PausedUntil
	// A row answered 429 is held under its claim until the pause ends,
	// keeping its own time (its place in the queue), then sent first.
	return until, until.After(t.now) && (until.After(r.NextAttemptAt) || r.LastStatus == 429)
}

// next says when r is attempted next: its own time, the end of its
// target's pause when that is later, or not at all while its target is
// disabled or not configured.
func (t targetsNow) next(r store.OutboxRow) string {
	switch {
	case t.claimed(r):
		return "now: claimed for sending until " + r.ClaimedUntil.UTC().Format(time.RFC3339) + " at the latest"
	case queued(r) && !t.configured[r.Target]:
		return "never (target not configured)"
	case queued(r) && t.states[r.Target].Disabled:
		return "when its target is enabled"
	}
	if until, ok := t.pausedPast(r); ok {
		return until.UTC().Format(time.RFC3339) + " (target paused)"
	}
	return timeOrDash(r.NextAttemptAt)
}

// claimed reports whether a dispatcher holds r's claim now (a claim whose
// end has passed was left by a process that stopped: r is due again).
func (t targetsNow) claimed(r store.OutboxRow) bool {
	return queued(r) && r.ClaimedUntil.After(t.now)
}

// rows is deliveryRows with the targets' state of the queued rows.
func (t targetsNow) rows(rows []store.OutboxRow) []deliveryRow {
	out := deliveryRows(rows)
	for i, r := range rows {
		if !queued(r) {
			continue
		}
		out[i].TargetNotConfigured = !t.configured[r.Target]
		out[i].TargetDisabled = t.states[r.Target].Disabled
		if t.claimed(r) {
			u := r.ClaimedUntil.UTC()
			out[i].ClaimedUntil = &u
		}
		if until, ok := t.pausedPast(r); ok {
			u := until.UTC()
			out[i].TargetPausedUntil = &u
		}
	}
	return out
}

// omitNil is b as a JSON value, or nil (omitted) when there is none.
func omitNil(b json.RawMessage) any {
	if b == nil {
		return nil
	}
	return b
}

func deliveryRows(rows []store.OutboxRow) []deliveryRow {
	out := make([]deliveryRow, len(rows))
	for i, r := range rows {
		out[i] = deliveryRow{ID: r.ID, Target: r.Target, EventID: r.EventID, EventType: r.EventType, Proxied: r.Proxied, Status: r.Status,
			Attempts: r.Attempts, LastStatus: r.LastStatus, CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.UpdatedAt.UTC()}
		if r.LastStatus != 0 {
			out[i].LastResponse = r.LastError // the target's words, not an error of ours
		} else {
			out[i].LastError = r.LastError
		}
		if !r.NextAttemptAt.IsZero() {
			t := r.NextAttemptAt.UTC()
			out[i].NextAttemptAt = &t
		}
	}
	return out
}

// attemptRow is an attempt as --json prints it.
type attemptRow struct {
	Attempt    int       `json:"attempt"`
	URL        string    `json:"url"`
	StatusCode int       `json:"status_code"`
	Error      string    `json:"error,omitempty"`
	Body       string    `json:"body,omitempty"`
	RequestID  string    `json:"request_id"`
	DurationMS int64     `json:"duration_ms"`
	At         time.Time `json:"at"`
	Redirect   bool      `json:"redirect"`
}

func attemptRows(as []store.Attempt) []attemptRow {
	out := make([]attemptRow, len(as))
	for i, a := range as {
		out[i] = attemptRow{Attempt: a.Attempt, URL: a.URL, StatusCode: a.StatusCode, Error: a.Error, Body: a.Body,
			RequestID: a.RequestID, DurationMS: a.Duration.Milliseconds(), At: a.At.UTC(), Redirect: a.Redirect}
	}
	return out
}

func writeJSONOut(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, usagef("%q is not a delivery id (a positive number, see deliveries list)", s)
	}
	return id, nil
}

func lastOutcome(r store.OutboxRow) string {
	switch {
	case r.LastStatus != 0:
		return strconv.Itoa(r.LastStatus)
	case r.LastError != "":
		return oneLine(r.LastError, 40)
	}
	return "-"
}

func timeOrDash(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func statusOrDash(code int) string {
	if code == 0 {
		return "-"
	}
	return strconv.Itoa(code)
}

// oneLine returns s on one line for a terminal, cut to n runes: line
// breaks and tabs become spaces, other control characters (an escape
// sequence in a target's answer), format characters (bidirectional
// overrides that reorder what the terminal shows) and invalid UTF-8 are
// shown escaped.
func oneLine(s string, n int) string {
	var b strings.Builder
	count := 0
	for _, r := range s {
		if count == n {
			b.WriteString("…")
			break
		}
		switch {
		case r == '\n' || r == '\r' || r == '\t':
			b.WriteByte(' ')
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == utf8.RuneError:
			// A target's answer is anyone's bytes: an escape sequence
			// printed raw would drive the operator's terminal.
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
		count++
	}
	return b.String()
}

func hasTarget(targets []config.Target, name string) bool {
	for _, t := range targets {
		if t.Name == name {
			return true
		}
	}
	return false
}

func (m *Main) deliveriesRedirectCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "redirect ID URL",
		Short: "Send one delivery once, now, to another URL (an inspector, say)",
		Long: `redirect sends the delivery's payload once to URL, signed as for its target,
through the same SSRF guard (private and loopback addresses are refused unless
the target has allow_private). The attempt is logged with the delivery's
attempts, marked as a redirect, under the delivery's next attempt number
(X-Delivery-Attempt; the delivery's count moves past it, so each attempt
has its own number); the delivery's status, failures and next attempt do
not change. It is refused while the delivery is claimed for sending.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				return usagef("%s: want the delivery's id and the URL to send it to, e.g. %s 42 https://inspector.example.com/in (got %d arguments)",
					subcommandPath(cmd), cmd.CommandPath(), len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			if u, err := url.Parse(args[1]); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return usagef("%q: want an http or https URL", args[1])
			}
			db, cfg, err := m.openStore(cmd.Context(), g)
			if err != nil {
				return err
			}
			defer db.Close()
			row, ok, err := db.Delivery(cmd.Context(), id)
			if err != nil {
				return err
			}
			if !ok {
				return noDelivery(id)
			}
			if !hasTarget(cfg.Targets, row.Target) {
				// It is sent with its target's settings (secret,
				// allow_private, timeouts), which are gone.
				return usagef("delivery %d is for target %q, which is not in the configuration: it is redirected with its target's secret and settings; "+
					"add the target back to targets to redirect it", id, row.Target)
			}
			queue := newDeliveryQueue(db)
			d, err := delivery.New(queue, deliveryTargets(cfg), delivery.Options{})
			if err != nil {
				return usageError{err}
			}
			a, err := d.Redirect(cmd.Context(), row, args[1])
			if fl := (*backstop.InFlightError)(nil); errors.As(err, &fl) {
				return fmt.Errorf("delivery %d is claimed for sending to %s (its attempt is in flight, or waits for a free slot "+
					"or for a 429's pause to end), so nothing was sent: the attempt in flight has the number a redirect would take. "+
					"Redirect it once that attempt is recorded (it is claimed until %s at the latest). See it with: backstop deliveries show %d",
					id, row.Target, fl.Until.Local().Format(time.RFC3339), id)
			}
			if err != nil {
				return err
			}
			// a.URL is the URL as attempts show it: without its password,
			// query values and token-like path segments.
			if a.StatusCode >= 200 && a.StatusCode < 300 {
				_, err = fmt.Fprintf(m.Stdout, "delivery %d sent to %s: %d in %s (request %s)\n", id, a.URL, a.StatusCode, round(a.Duration), a.RequestID)
				return err
			}
			if a.StatusCode == 0 {
				fmt.Fprintf(m.Stdout, "delivery %d could not be sent to %s: %s (request %s)\n", id, a.URL, a.Error, a.RequestID)
			} else {
				fmt.Fprintf(m.Stdout, "delivery %d sent to %s: answered %d (request %s)\n", id, a.URL, a.StatusCode, a.RequestID)
			}
			return fmt.Errorf("redirect of delivery %d to %s did not succeed", id, a.URL)
		},
	}
}

// notFound says what was not found; errors.Is matches backstop.ErrNotFound.
type notFound string

func (e notFound) Error() string { return string(e) }

// Is makes notFound a backstop.ErrNotFound.
func (notFound) Is(target error) bool { return target == backstop.ErrNotFound }

// noDelivery is the error for a delivery ID that is not in the store.
func noDelivery(id int64) error {
	return notFound(fmt.Sprintf("no delivery %d (see backstop deliveries list)", id))
}
