package main

import (
	"github.com/spf13/cobra"

	"github.com/backstop-sync/backstop"
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
at the beginning of the feed.

RESOURCE is contacts, chats, messages or payments; all four by default, run
at once under one shared rate-limit governor.

Ctrl-C finishes the page being written, saves the cursor and exits 130.`,
		Example: "  backstop sync\n  backstop sync payments --json",
		RunE: func(cmd *cobra.Command, args []string) error {
			return m.runFeed(cmd, g, "sync", args, asJSON, func(a *app) runFunc { return a.engine.Sync })
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the summary as JSON")
	return cmd
}

// runFeed is the body shared by sync and backfill: open everything, run the
// operation over the resources with progress, print the summary.
func (m *Main) runFeed(cmd *cobra.Command, g *globals, op string, args []string, asJSON bool, pick func(*app) runFunc) error {
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
	prog.log = a.log
	a.engine.OnPage = prog.page
	stats, runErr := runResources(ctx, resources, prog, pick(a))
	prog.wait()
	if err := printStats(m.Stdout, op, stats, asJSON); err != nil {
		return err
	}
	return runErr
}
