package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/backstop-sync/backstop"
	bsync "github.com/backstop-sync/backstop/sync"
)

func (m *Main) backfillCommand(g *globals) *cobra.Command {
	var (
		asJSON  bool
		restart bool
		emit    bool
		noEmit  bool
	)
	cmd := &cobra.Command{
		Use:   "backfill [RESOURCE...]",
		Short: "Read every object from the start of the feed into the mirror",
		Long: `backfill reads each resource's whole change feed from the start into the
mirror. It keeps its own checkpoint, committed with every page, so a backfill
that is killed resumes from its last page when run again, and a resource whose
backfill already finished is skipped; --restart reads everything from the start
again. It never moves the incremental (sync) cursor backwards: when it
finishes, it hands its position to the sync cursor only if that is behind.

The mirror never goes back in time: an object is written only when it is newer
than the stored version.

With --emit it also emits, as sync does, the event of every object that is
new to the mirror or newer than its mirrored version (origin backfill), to
the targets whose events match. Without it, the history is written without
events: the versions from before the backfill started, and before the
oldest event of the resource backstop keeps, less 10 minutes. A newer
version (a change made while it runs, or one whose webhook the platform
lost since backstop has been taking the resource's events) is emitted all
the same, as sync would (origin sync, through the dedup, so one a webhook
brought already is not sent again): written silently, it would look
unchanged to reconcile, and its event would never reach the targets. The
summary counts those as emitted.

Without --emit, a backfill is refused (exit 2, nothing read) for a resource
whose events some target subscribes to, unless it is that resource's first
fill (no sync cursor yet, and an empty mirror or an unfinished backfill to
resume): on a resource that is already syncing, the changes it wrote into
the mirror would look unchanged to sync and reconcile and never reach the
targets. Use --emit there; it emits only what is new or newer than the
mirror, so what was already emitted is not sent again. --no-emit fills the
mirror anyway, without events for its history, for when the targets must
not get them (what it writes silently then never reaches them).

RESOURCE is contacts, chats, messages or payments; all four by default.
Ctrl-C finishes the page being written, saves the checkpoint and exits 130.`,
		Example: "  backstop backfill\n  backstop backfill payments --restart\n  backstop backfill contacts --emit",
		RunE: func(cmd *cobra.Command, args []string) error {
			resumeFlags := ""
			switch {
			case emit:
				resumeFlags = "--emit"
			case noEmit:
				resumeFlags = "--no-emit"
			}
			return m.runFeed(cmd, g, "backfill", args, asJSON, restartHint(emit, noEmit), resumeFlags, func(ctx context.Context, a *app, resources []backstop.Resource, emits *emitCounts) (runFunc, error) {
				routes := routesOf(a.cfg)
				if emit && noEmit {
					return nil, usagef("--emit and --no-emit exclude each other")
				}
				if !noEmit {
					// A finished backfill's hint then says --emit where
					// a restart needs it.
					a.engine.Routes = routes
				}
				if !emit {
					if !noEmit {
						if err := checkSilentBackfill(ctx, cmd, a, resources, restart, routes); err != nil {
							return nil, err
						}
					}
					return func(ctx context.Context, r backstop.Resource) (backstop.RunStats, error) {
						st, em, err := a.engine.BackfillQuiet(ctx, r, restart, routes)
						emits.add(r, em)
						return st, err
					}, nil
				}
				return func(ctx context.Context, r backstop.Resource) (backstop.RunStats, error) {
					st, em, err := a.engine.BackfillEmit(ctx, r, restart, routes)
					emits.add(r, em)
					return st, err
				}, nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the summary as JSON")
	cmd.Flags().BoolVar(&restart, "restart", false, "start from the beginning, whatever the checkpoint says")
	cmd.Flags().BoolVar(&emit, "emit", false, "also emit the events of new and newer objects to the targets")
	cmd.Flags().BoolVar(&noEmit, "no-emit", false, "fill the mirror without events for its history even where targets subscribe (what it writes silently never reaches them)")
	return cmd
}

// checkSilentBackfill refuses, as a usage error naming every refused
// resource, a backfill without --emit that would lose events
// (bsync.Engine.CheckBackfill).
// The command it suggests is this one's, with --emit: its --config, if
// given, and --restart, if given.
func checkSilentBackfill(ctx context.Context, cmd *cobra.Command, a *app, resources []backstop.Resource, restart bool, routes []backstop.Route) error {
	again := ""
	if restart {
		again = " --restart"
	}
	var errs []error
	for _, r := range resources {
		err := a.engine.CheckBackfill(ctx, r, restart, routes)
		switch {
		case errors.Is(err, bsync.ErrSilentBackfill):
			errs = append(errs, usageError{fmt.Errorf("%w; run `%s backfill %s%s --emit` to emit them (or --no-emit to fill the mirror without them)", err, commandPrefix(cmd), r, again)})
		case err != nil:
			return err
		}
	}
	return errors.Join(errs...)
}
