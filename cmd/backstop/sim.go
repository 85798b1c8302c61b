package main

import (
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/spf13/cobra"

	"github.com/backstop-sync/backstop/sources/sim"
)

func (m *Main) simCommand(g *globals) *cobra.Command {
	var (
		opts   sim.Options
		listen string
	)
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run the platform simulator (the API contract, served from memory)",
		Long: `sim serves the platform's public API from memory, for trying backstop out and
for tests: contacts, chats, messages and payments generated from a seed (with
runs of equal updated_at, unicode text and a few objects over 64 KiB),
fixed-window rate limits with X-RateLimit-* headers and 429 Retry-After,
injected 5xx errors and latency, and a mutation generator that creates and
updates objects while it runs. With --webhook-url (and --mutation-rate, which
makes the changes) it also sends a signed webhook for every mutation, losing,
duplicating and reordering some on request (--drop-rate, --duplicate-rate,
--reorder-rate) and retrying those not answered 2xx on the platform's schedule
(--retry-schedule).

It prints its base URL and API key, then serves until Ctrl-C.`,
		Example: `  backstop sim --listen 127.0.0.1:8081 --objects 5000 --limit 600 --window 1m
  BOTIX_API_KEY=sim_test_key backstop backfill   # with source.base_url pointing at it`,
		Args: cobraArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.newLogger(m.Stderr)
			if err != nil {
				return err
			}
			if opts.WebhookSecret == "" {
				opts.WebhookSecret, _ = m.LookupEnv("BOTIX_WEBHOOK_SECRET")
			}
			if opts.WebhookURL != "" && opts.WebhookSecret == "" {
				return usagef("--webhook-url needs a signing secret: --webhook-secret or BOTIX_WEBHOOK_SECRET")
			}
			// The flags say what they mean: 0 objects is an empty
			// platform and 0 big objects is none, where sim.Options
			// reads 0 as "the default".
			switch {
			case opts.Objects < 0 || opts.Objects > maxSimObjects:
				// Every object is held in memory: a million per resource
				// takes about 3 GB (more ran the process out of memory).
				return usagef("--objects %d: want 0 to %d per resource (the simulator holds them all in memory, about 3 GB at the most)", opts.Objects, maxSimObjects)
			case opts.BigObjects < 0 || opts.BigObjects > maxSimObjects:
				return usagef("--big-objects %d: want 0 to %d", opts.BigObjects, maxSimObjects)
			case opts.Window < time.Second || opts.Window%time.Second != 0:
				return usagef("--window %s: want whole seconds, 1s or more (X-RateLimit-Reset is in seconds)", opts.Window)
			}
			if err := checkSimFlags(opts); err != nil {
				return err
			}
			// Webhooks are made only for --webhook-url, and only of the
			// changes --mutation-rate makes: a flag shaping them without
			// both would be ignored, and the simulator would send nothing.
			if opts.WebhookURL == "" {
				for _, name := range []string{"drop-rate", "duplicate-rate", "reorder-rate", "retry-schedule", "webhook-secret"} {
					if cmd.Flags().Changed(name) {
						return usagef("--%s shapes the webhooks sent to --webhook-url, which is not set: no webhook would be sent", name)
					}
				}
			} else if opts.MutationRate == 0 {
				return usagef("--webhook-url: a webhook is sent for every change, and without --mutation-rate nothing changes: set --mutation-rate too")
			}
			if opts.Objects == 0 {
				opts.Objects = -1
			}
			if opts.BigObjects == 0 {
				opts.BigObjects = -1
			}
			if err := opts.Validate(); err != nil {
				return usageError{err}
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return usagef("--listen %s: %v", listen, err)
			}
			opts.Logger = log
			s := sim.New(opts)
			fmt.Fprintf(m.Stdout, "base_url=http://%s\napi_key=%s\n", ln.Addr(), s.APIKey())
			log.Info("simulator serving", "addr", ln.Addr().String(), "objects_per_resource", max(opts.Objects, 0),
				"limit", opts.Limit, "window", opts.Window, "error_rate", opts.ErrorRate,
				"latency", opts.Latency, "mutation_rate", opts.MutationRate)
			if err := s.Serve(cmd.Context(), ln); err != nil {
				return err
			}
			st := s.Stats()
			attrs := []any{"requests", st.Requests, "rate_limited", st.RateLimited, "errors", st.Errors}
			if opts.WebhookURL != "" {
				ws := s.WebhookStats()
				attrs = append(attrs, "webhook_events", ws.Events, "webhooks_delivered", ws.Delivered,
					"webhooks_dropped", ws.Dropped, "webhook_attempts", ws.Attempts, "webhooks_given_up", ws.GaveUp)
			}
			log.Info("simulator stopped", attrs...)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "127.0.0.1:8081", "address to listen on (port 0 picks a free one)")
	f.Int64Var(&opts.Seed, "seed", 1, "seed for the generated data")
	f.IntVar(&opts.Objects, "objects", 1000, "objects per resource at start (0: none)")
	f.StringVar(&opts.APIKey, "api-key", "sim_test_key", "the API key the simulator accepts")
	f.IntVar(&opts.Limit, "limit", 0, "requests per window per API key (0: no limit)")
	f.DurationVar(&opts.Window, "window", time.Minute, "rate-limit window, whole seconds (1s or more)")
	f.StringVar(&opts.RetryAfter, "retry-after", "seconds", "Retry-After form on 429: seconds, date, rfc850, asctime or mixed (cycles through all)")
	f.Float64Var(&opts.ErrorRate, "error-rate", 0, "fraction of requests answered with a 5xx")
	f.DurationVar(&opts.Latency, "latency", 0, "latency added to every response")
	f.Float64Var(&opts.MutationRate, "mutation-rate", 0, "objects created or updated per second")
	f.IntVar(&opts.BigObjects, "big-objects", 3, "messages over 64 KiB (sent as truncated webhooks; 0: none)")
	f.StringVar(&opts.WebhookURL, "webhook-url", "", "send a signed webhook (botix scheme) for every mutation to this URL")
	f.StringVar(&opts.WebhookSecret, "webhook-secret", "", "the webhook signing secret (default: env BOTIX_WEBHOOK_SECRET)")
	f.Float64Var(&opts.DropRate, "drop-rate", 0, "fraction of webhooks never sent (lost by the platform)")
	f.Float64Var(&opts.DuplicateRate, "duplicate-rate", 0, "fraction of webhooks sent twice")
	f.Float64Var(&opts.ReorderRate, "reorder-rate", 0, "fraction of webhooks held back and sent after later ones")
	f.DurationSliceVar(&opts.RetrySchedule, "retry-schedule", sim.DefaultRetrySchedule(), "the platform's retries of a webhook answered non-2xx")
	return cmd
}

// checkSimFlags refuses the bad values sim.Options.Validate would, naming
// the flag each came from rather than the option.
func checkSimFlags(opts sim.Options) error {
	for _, r := range []struct {
		flag string
		v    float64
	}{{"--error-rate", opts.ErrorRate}, {"--drop-rate", opts.DropRate}, {"--duplicate-rate", opts.DuplicateRate}, {"--reorder-rate", opts.ReorderRate}} {
		if !(r.v >= 0 && r.v <= 1) { // NaN too
			return usagef("%s %g: want a fraction, 0 to 1", r.flag, r.v)
		}
	}
	switch {
	case opts.Limit < 0:
		return usagef("--limit %d: want 0 (no limit) or more", opts.Limit)
	case opts.Latency < 0:
		return usagef("--latency %s: want 0 or more", opts.Latency)
	case !(opts.MutationRate >= 0 && opts.MutationRate <= sim.MaxMutationRate): // NaN too
		return usagef("--mutation-rate %g: want a number of changes per second, 0 to %d", opts.MutationRate, sim.MaxMutationRate)
	case opts.Objects > sim.MaxObjects:
		return usagef("--objects %d: want at most %d per resource (the simulator holds them all in memory)", opts.Objects, sim.MaxObjects)
	}
	switch opts.RetryAfter {
	case sim.RetryAfterSeconds, sim.RetryAfterDate, sim.RetryAfterRFC850, sim.RetryAfterAsctime, sim.RetryAfterMixed:
	default:
		return usagef("--retry-after %q: want seconds, date, rfc850, asctime or mixed", opts.RetryAfter)
	}
	for _, d := range opts.RetrySchedule {
		if d < 0 {
			return usagef("--retry-schedule %v: waits must not be negative", opts.RetrySchedule)
		}
	}
	if opts.WebhookURL != "" {
		if u, err := url.Parse(opts.WebhookURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return usagef("--webhook-url %q: want an absolute http or https URL", opts.WebhookURL)
		}
	}
	return nil
}

// maxSimObjects bounds sim's --objects (per resource) and --big-objects.
const maxSimObjects = 1_000_000
