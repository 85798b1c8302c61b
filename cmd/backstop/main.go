// Command backstop keeps a local SQLite mirror of a SaaS platform's public
// API and makes sure no event is lost between the platform and the systems
// that consume its events. Run `backstop --help` for the commands.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	// The zone database is built in: cron schedules follow TZ (or
	// /etc/localtime) even on a machine or container without tzdata,
	// where Go would otherwise fall back to UTC without a word.
	_ "time/tzdata"

	"github.com/spf13/cobra"

	"github.com/backstop-sync/backstop/internal/gctune"
)

// Exit codes, as documented in the README and DESIGN.md.
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitBusy        = 75 // run refused: the job runs in another process (sysexits' EX_TEMPFAIL: try again later)
	exitInterrupted = 130
)

func main() {
	gctune.Start() // unless GOGC is set: see the package
	m := NewMain()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal, a second one kills at once: restore the
		// default handling so the user is never stuck.
		<-ctx.Done()
		stop()
	}()
	os.Exit(m.Run(ctx, os.Args[1:]))
}

// Main is the program: its streams and environment are fields so tests can
// drive it end to end in-process.
type Main struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// LookupEnv reads the environment (config ${VAR} expansion, BACKSTOP_CONFIG).
	LookupEnv func(string) (string, bool)
	// IsTerminal reports whether progress bars may be drawn on Stderr.
	IsTerminal bool
}

// NewMain returns a Main wired to the process's streams and environment.
func NewMain() *Main {
	return &Main{
		Stdin:      os.Stdin,
		Stdout:     os.Stdout,
		Stderr:     os.Stderr,
		LookupEnv:  os.LookupEnv,
		IsTerminal: isTerminal(os.Stderr),
	}
}

// Run executes one command line and returns the process exit code:
// 0 success, 1 failure, 2 bad usage or configuration, 75 a run refused
// because its job runs in another process (run), 130 interrupted.
func (m *Main) Run(ctx context.Context, args []string) int {
	root := m.rootCommand()
	root.SetArgs(args)
	root.SetIn(m.Stdin)
	root.SetOut(m.Stdout)
	root.SetErr(m.Stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	code := exitCode(ctx, err)
	if code == exitInterrupted {
		if msg, ok := interruptedMsg[cmdName(cmd)]; ok {
			fmt.Fprintln(m.Stderr, "backstop: interrupted; "+msg)
		} else {
			// demo removes its temporary store; deliveries and the
			// others have no pages to speak of.
			fmt.Fprintln(m.Stderr, "backstop: interrupted")
		}
	} else {
		// One line per problem: a configuration with several has them
		// all in one error.
		for line := range strings.SplitSeq(err.Error(), "\n") {
			fmt.Fprintf(m.Stderr, "backstop: %s\n", line)
		}
	}
	return code
}

// interruptedMsg says, for the commands that commit their work page by
// page, what an interrupted one keeps and where its next run goes on.
var interruptedMsg = map[string]string{
	"sync":     "progress up to the last committed page is saved",
	"backfill": "progress up to the last committed page is saved",
	// A reconcile has no checkpoint.
	"reconcile": "the events re-emitted up to the last committed page are queued; the next reconcile compares its whole window again",
	"run":       "what the job committed up to its last page is kept",
}

// cmdName is cmd's name, "" for none.
func cmdName(cmd *cobra.Command) string {
	if cmd == nil {
		return ""
	}
	return cmd.Name()
}

// usageError marks bad flags, arguments or configuration (exit 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// busyError marks a run refused because its job runs elsewhere (exit 75).
type busyError struct{ err error }

func (e busyError) Error() string { return e.err.Error() }
func (e busyError) Unwrap() error { return e.err }

func exitCode(ctx context.Context, err error) int {
	var ue usageError
	var be busyError
	switch {
	case errors.As(err, &ue), strings.HasPrefix(err.Error(), "unknown command "):
		return exitUsage
	case errors.As(err, &be):
		return exitBusy
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		return exitInterrupted
	}
	return exitFailure
}
