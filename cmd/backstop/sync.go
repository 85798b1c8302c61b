package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	stdsync "sync"

	"github.com/spf13/cobra"

	"github.com/backstop-sync/backstop"
	bsync "github.com/backstop-sync/backstop/sync"
)

func (m *Main) syncCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "sync [RESOURCE...]",
		Short: "Bring the mirror up to date from the saved cursors",
		Long: `sync reads each resource's change feed from its saved cursor to the end and
writes what changed into the mirror. Each page and the cursor after it are
committed in one transaction, so the cursor is never ahead of the mirror and an
interrupted sync resumes where it stopped. Without a saved cursor, sync starts
at the beginning of the feed (run backfill first to fill the mirror without
emitting).

Like the sync job, it emits the event of every object that is new to the
mirror or newer than its mirrored version (origin sync) through the emit path:
de-duplicated against the webhooks and earlier runs, and queued for the
targets whose events match, which serve delivers. The sync job and this
command share the cursor, so a change either one reads is emitted once.

RESOURCE is contacts, chats, messages or payments; all four by default, run
at once under one shared rate-limit governor.

Ctrl-C finishes the page being written, saves the cursor and exits 130.`,
		Example: "  backstop sync\n  backstop sync payments --json",
		RunE: func(cmd *cobra.Command, args []string) error {
			return m.runFeed(cmd, g, "sync", args, asJSON, resetHint, "", func(_ context.Context, a *app, _ []backstop.Resource, emits *emitCounts) (runFunc, error) {
				routes := routesOf(a.cfg)
				return func(ctx context.Context, r backstop.Resource) (backstop.RunStats, error) {
					st, em, err := a.engine.SyncEmit(ctx, r, routes)
					emits.add(r, em)
					return st, err
				}, nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the summary as JSON")
	return cmd
}

// runFeed is the body shared by sync and backfill: open everything, run the
// operation over the resources with progress, print the summary. pick
// makes the operation for the resources, or refuses it (nothing runs); one
// that emits counts what it emitted in emits, and the summary then shows
// those counts. startOver is the command that starts a resource's feed
// over, named when the platform can no longer read its saved cursor.
// resumeFlags are the flags a run that resumes an interrupted one must
// repeat (backfill's --emit or --no-emit).
func (m *Main) runFeed(cmd *cobra.Command, g *globals, op string, args []string, asJSON bool,
	startOver func(backstop.Resource) string, resumeFlags string,
	pick func(context.Context, *app, []backstop.Resource, *emitCounts) (runFunc, error)) error {
	resources, err := backstop.ParseResources(args)
	if err != nil {
		return usageError{err}
	}
	ctx := cmd.Context()
	prog := newProgress(m, op, resources)
	a, err := m.openApp(ctx, g, prog.out)
	if err != nil {
		prog.abort()
		return err
	}
	defer a.Close()
	prog.start(a.log)
	a.engine.OnPage = prog.page
	// Pages are refused once the cursor is reset meanwhile (backstop
	// cursors reset), instead of saving over the reset.
	a.engine.EmitGuard = a.db
	emits := &emitCounts{}
	fn, err := pick(ctx, a, resources, emits)
	if err != nil {
		prog.abort()
		return err
	}
	stats, runErr := runResources(ctx, resources, prog, fn)
	prog.wait()
	if err := printStats(m.Stdout, op, stats, emits.byResource(), asJSON); err != nil {
		return err
	}
	if isCanceled(runErr) && ctx.Err() != nil {
		fmt.Fprintf(m.Stderr, "backstop: to resume, run `%s`\n", resumeCommand(cmd, op, stats, resumeFlags))
	}
	return withCursorHint(cmd, runErr, startOver)
}

// resumeCommand is the command line that resumes an interrupted sync or
// backfill: the same command over the resources that did not finish,
// with --config when it was given and resumeFlags, and never --restart
// (which would throw away what the interrupted run committed).
func resumeCommand(cmd *cobra.Command, op string, stats []backstop.RunStats, resumeFlags string) string {
	line := commandPrefix(cmd) + " " + op
	for _, st := range stats {
		if st.Err != nil {
			line += " " + string(st.Resource)
		}
	}
	if resumeFlags != "" {
		line += " " + resumeFlags
	}
	return line
}

// commandPrefix is how a command printed for the user to run next starts:
// "backstop", with the --config this one was given, if any.
func commandPrefix(cmd *cobra.Command) string {
	if f := cmd.Flag("config"); f != nil && f.Changed {
		return "backstop --config " + shellWord(f.Value.String())
	}
	return "backstop"
}

// shellWord quotes s for a POSIX shell when it needs it.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:@") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// withCursorHint adds to the error of a saved cursor the platform could no
// longer read what to do about it: nothing resets a cursor on its own.
// startOver names the command that starts the resource's feed over: a
// sync's cursor is reset (resetHint), a backfill's checkpoint is read
// again with --restart (restartHint), which keeps the sync cursor.
// The command begins with cmd's commandPrefix (its --config, if given).
func withCursorHint(cmd *cobra.Command, err error, startOver func(backstop.Resource) string) error {
	var ae *backstop.APIError
	if startOver != nil && errors.As(err, &ae) && errors.Is(err, backstop.ErrInvalidCursor) && ae.Resource != "" {
		return fmt.Errorf("%w; run `%s %s` to start its feed over", err, commandPrefix(cmd), startOver(ae.Resource))
	}
	return err
}

// resetHint is the command (after "backstop") that starts r's sync over
// from the beginning.
func resetHint(r backstop.Resource) string { return "cursors reset " + string(r) }

// restartHint returns the command (after "backstop") that reads r's
// backfill from the start again, keeping the sync cursor, with the
// backfill's emit flag.
func restartHint(emit, noEmit bool) func(backstop.Resource) string {
	return func(r backstop.Resource) string {
		cmd := "backfill " + string(r) + " --restart"
		switch {
		case emit:
			cmd += " --emit"
		case noEmit:
			cmd += " --no-emit"
		}
		return cmd
	}
}

// emitCounts collects what the resources of one run emitted.
type emitCounts struct {
	mu stdsync.Mutex
	by map[backstop.Resource]bsync.EmitStats
}

// add records r's counts.
func (c *emitCounts) add(r backstop.Resource, st bsync.EmitStats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = map[backstop.Resource]bsync.EmitStats{}
	}
	c.by[r] = st
}

// byResource returns the counts by resource, nil when the run emitted
// nothing because it does not emit.
func (c *emitCounts) byResource() map[backstop.Resource]bsync.EmitStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.by
}
