package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/backstop-sync/backstop"
)

func (m *Main) cursorsCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "cursors",
		Short: "List the saved cursors",
		Long: `cursors lists each resource's saved cursors: the incremental cursor that
sync moves ("sync") and the backfill checkpoint ("backfill"), with the
position (updated_at and id of the last object read) each stands after.`,
		Args: cobraArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			db, _, err := m.openStore(cmd.Context(), g)
			if err != nil {
				return err
			}
			defer db.Close()
			curs, err := db.Cursors(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				type row struct {
					Resource  string    `json:"resource"`
					Kind      string    `json:"kind"`
					Cursor    string    `json:"cursor"`
					UpdatedAt string    `json:"position_updated_at,omitempty"`
					ID        string    `json:"position_id,omitempty"`
					Done      bool      `json:"done"`
					SavedAt   time.Time `json:"saved_at"`
					// StartedAt is when the backfill that began a
					// checkpoint started (absent when unknown).
					StartedAt time.Time `json:"started_at,omitzero"`
				}
				rows := make([]row, 0, len(curs))
				for _, c := range curs {
					r := row{Resource: string(c.Resource), Kind: string(c.Kind), Cursor: c.Value, ID: c.Position.ID, Done: c.Done, SavedAt: c.UpdatedAt.UTC(), StartedAt: c.StartedAt.UTC()}
					if !c.Position.UpdatedAt.IsZero() {
						r.UpdatedAt = backstop.CanonicalTime(c.Position.UpdatedAt)
					}
					rows = append(rows, r)
				}
				return writeJSONOut(m.Stdout, rows)
			}
			if len(curs) == 0 {
				_, err := fmt.Fprintln(m.Stdout, "no cursors saved yet: the next sync or backfill starts at the beginning of each feed")
				return err
			}
			tw := tabwriter.NewWriter(m.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "RESOURCE\tKIND\tPOSITION\tDONE\tSAVED")
			for _, c := range curs {
				done := "-"
				if c.Kind == backstop.CursorBackfill {
					done = fmt.Sprint(c.Done)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.Resource, c.Kind, c.Position, done,
					c.UpdatedAt.UTC().Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	cmd.AddCommand(m.cursorsResetCommand(g))
	return cmd
}

func (m *Main) cursorsResetCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "reset RESOURCE",
		Short: "Forget a resource's cursors so the next sync starts from the beginning",
		Long: `reset deletes both saved cursors of RESOURCE (sync and backfill). The mirror is
kept: the next sync reads the whole feed again and, since the mirror never goes
back in time, only writes objects newer than what it holds. A sync or backfill
of RESOURCE running meanwhile stops at its next page, without saving its
position over the reset (it exits 1 and says so).`,
		Args: oneArg("the resource whose cursors to forget: contacts, chats, messages or payments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := backstop.ParseResource(args[0])
			if err != nil {
				return usageError{err}
			}
			db, _, err := m.openStore(cmd.Context(), g)
			if err != nil {
				return err
			}
			defer db.Close()
			if err := db.ResetCursors(cmd.Context(), r); err != nil {
				return err
			}
			_, err = fmt.Fprintf(m.Stdout, "reset the cursors of %s: the next sync starts at the beginning of its feed\n", r)
			return err
		},
	}
}
