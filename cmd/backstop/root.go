package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"
	"github.com/vbauerster/cupwriter"
)

// globals are the flags every command takes.
type globals struct {
	configPath string
	logFormat  string
	logLevel   string
	// readsStore is set by the commands that only read the store (see
	// readsStore): openStore then refuses a store.path with no database
	// rather than create an empty one.
	readsStore bool
	// command is how a command printed for the user to run next begins
	// (commandPrefix: "backstop", with --config when it was given).
	command string
}

func (m *Main) rootCommand() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "backstop",
		Short: "Keep a local mirror of the platform's API and lose no event",
		Long: `backstop keeps a local SQLite mirror of the platform's contacts, chats,
messages and payments and makes sure no event is lost between the platform and
the systems that consume it:

  sync, backfill   page through each resource from persisted cursors, under a
                   rate-limit governor that paces requests from the
                   X-RateLimit-* headers so the API key never sees a 429 storm
  serve            receive webhooks (verified, de-duplicated, committed before
                   2xx), deliver them on to the targets, run the jobs
  reconcile        compare the platform with the mirror and re-emit every event
                   the webhooks missed, through the same path
  deliveries       the delivery log (list, show, retry, redirect, purge) and
                   the targets' state

Configuration comes from schedules.yaml (--config, or BACKSTOP_CONFIG);
${VAR} in it expands from the environment, so secrets stay out of the file.

Exit codes: 0 success, 1 failure, 2 bad usage or configuration, 75 a run skipped
because the job runs in another process (backstop run), 130 interrupted.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// --version, which people try first, prints what "version" does.
		Version: versionString(),
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.InitDefaultVersionFlag()
	root.Flags().Lookup("version").Usage = "print the version, as the version command does"
	def := "./schedules.yaml"
	if v, ok := m.LookupEnv("BACKSTOP_CONFIG"); ok && v != "" {
		def = v
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.configPath, "config", def, "configuration file (env BACKSTOP_CONFIG)")
	pf.StringVar(&g.logFormat, "log-format", "text", "log format: text or json")
	pf.StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	// --log-level and --log-format are checked before any command runs,
	// also one that logs nothing (cursors, deliveries, version): a bad
	// value is bad usage (exit 2) everywhere, not only where a logger is
	// built.
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		g.command = commandPrefix(cmd)
		_, err := g.newLogger(io.Discard)
		return err
	}

	root.SetHelpCommand(helpCommand())
	root.AddCommand(
		m.showsProgress(m.syncCommand(g)),
		m.showsProgress(m.backfillCommand(g)),
		readsStore(g, readsStore(g, m.cursorsCommand(g)), "reset"),
		m.showsProgress(m.reconcileCommand(g)),
		m.showsProgress(m.runCommand(g)),
		readsStore(g, m.jobsCommand(g)),
		m.demoCommand(g),
		readsStore(g, readsStore(g, m.deliveriesCommand(g), "list", "show", "targets", "retry", "redirect", "purge"), "targets enable"),
		readsStore(g, m.backupCommand(g)),
		m.restoreCommand(g),
		m.serveCommand(g),
		m.simCommand(g),
		m.versionCommand(),
	)
	return root
}

// helpCommand is cobra's help command, but an unknown topic is bad usage
// (exit 2): cobra's printed "Unknown help topic" and exited 0.
func helpCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		Long:  "help prints the help of any command: backstop help deliveries retry.",
		RunE: func(cmd *cobra.Command, args []string) error {
			target, rest, err := cmd.Root().Find(args)
			if err != nil || len(rest) > 0 || target == nil {
				return usageError{fmt.Errorf("help: unknown help topic %q: backstop --help lists the commands", strings.Join(args, " "))}
			}
			return target.Help()
		},
	}
}

// readsStore marks cmd, or with names its subcommands of those names (not
// theirs; "targets enable" names a subcommand's), as commands that only read the store or change what is already
// in it (a cursor reset, a delivery retried): a store.path where no
// database exists, a mistyped one most likely, is refused (openStore)
// instead of answered from an empty database created there. Commands that
// fill the store (sync, backfill, serve) keep creating it.
func readsStore(g *globals, cmd *cobra.Command, names ...string) *cobra.Command {
	mark := func(c *cobra.Command) {
		beforeRun(c, func(*cobra.Command, []string) error {
			g.readsStore = true
			return nil
		})
	}
	if len(names) == 0 {
		mark(cmd)
		return cmd
	}
	for _, name := range names {
		path := strings.Fields(name) // "targets enable": a subcommand's
		sub, _, err := cmd.Find(path)
		if err != nil || sub == cmd || sub.Name() != path[len(path)-1] {
			panic(fmt.Sprintf("readsStore: %s has no subcommand %q", cmd.Name(), name))
		}
		mark(sub)
	}
	return cmd
}

// showsProgress checks, before cmd runs, the environment that its progress
// display reads (BACKSTOP_PROGRESS_INTERVAL): a bad value exits 2 instead
// of being ignored.
func (m *Main) showsProgress(cmd *cobra.Command) *cobra.Command {
	beforeRun(cmd, func(*cobra.Command, []string) error {
		_, err := progressInterval(m)
		return err
	})
	return cmd
}

// beforeRun makes fn run before cmd's own PreRun or PreRunE, if it has one.
func beforeRun(cmd *cobra.Command, fn func(*cobra.Command, []string) error) {
	preE, pre := cmd.PreRunE, cmd.PreRun
	cmd.PreRun = nil
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		if err := fn(c, args); err != nil {
			return err
		}
		switch {
		case preE != nil:
			return preE(c, args)
		case pre != nil:
			pre(c, args)
		}
		return nil
	}
}

// newLogger builds the process's one logger, writing to w.
func (g *globals) newLogger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(g.logLevel)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", g.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(g.logFormat) {
	case "text", "":
		opts.ReplaceAttr = func(_ []string, a slog.Attr) slog.Attr {
			if a.Value.Kind() == slog.KindDuration {
				a.Value = slog.DurationValue(roundLogDuration(a.Value.Duration()))
			}
			return a
		}
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		// Durations as people read them ("1.5s"), as the text format
		// shows them, not JSON's default of integer nanoseconds.
		opts.ReplaceAttr = func(_ []string, a slog.Attr) slog.Attr {
			if a.Value.Kind() == slog.KindDuration {
				a.Value = slog.StringValue(roundLogDuration(a.Value.Duration()).String())
			}
			return a
		}
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usagef("--log-format %q: want text or json", g.logFormat)
}

// roundLogDuration rounds a duration a log line shows to the millisecond
// (8.597s, not 8.597005569s), or, below a millisecond, to the microsecond,
// so that a short one does not read as 0s.
func roundLogDuration(d time.Duration) time.Duration {
	switch abs := d.Abs(); {
	case abs >= time.Millisecond:
		return d.Round(time.Millisecond)
	case abs >= time.Microsecond:
		return d.Round(time.Microsecond)
	}
	return d
}

// isTerminal reports whether progress bars may be drawn on f: a terminal
// that knows its size. The bars (mpb) fit themselves to the size the
// terminal reports, through cupwriter as here, and on one of 0×0 (a pty
// nobody sized: script without a size, some CI runners, docker exec -t
// before its resize) they drew nothing and dropped the log lines written
// above them, level=ERROR included; there the log lines are written
// plainly instead. A Cygwin terminal, which cupwriter does not measure, is
// drawn on at mpb's default size.
func isTerminal(f *os.File) bool {
	fd := f.Fd()
	if isatty.IsCygwinTerminal(fd) {
		return true
	}
	if !isatty.IsTerminal(fd) {
		return false
	}
	cw := cupwriter.New(f, false)
	if !cw.IsTerminal() {
		// mpb does not measure it either: it draws at its default size.
		return true
	}
	width, height, err := cw.GetTermSize()
	return err == nil && width > 0 && height > 0
}

// oneArg accepts exactly one argument, what; a usage error without it (or
// with more) says what it is.
func oneArg(what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		name := subcommandPath(cmd)
		switch {
		case len(args) == 0:
			return usagef("%s: missing argument: %s", name, what)
		case len(args) > 1:
			return usagef("%s: takes one argument (%s), got %d: %s", name, what, len(args), strings.Join(args, " "))
		}
		return nil
	}
}

// cobraArgs wraps an argument validator so its errors exit 2.
func cobraArgs(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := v(cmd, args); err != nil {
			return usageError{fmt.Errorf("%s: %w", subcommandPath(cmd), err)}
		}
		return nil
	}
}

// subcommandPath is cmd's path without the program's name ("deliveries
// show"), for the errors Main prints after "backstop: ".
func subcommandPath(cmd *cobra.Command) string {
	return strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
}
