package backstop

import "time"

// RunStats counts one run of sync or backfill over one resource.
type RunStats struct {
	Resource Resource
	Pages    int
	Objects  int
	New      int
	Updated  int
	Cost
	Duration time.Duration
	// Reached is the updated_at of the last object read: how far through
	// the feed (ordered by updated_at) the run has got.
	Reached time.Time
	// AlreadyDone is set by a backfill that read nothing because the
	// resource's backfill had finished before.
	AlreadyDone bool
	// Err is the error that stopped the run, nil when it finished.
	Err error
}

// AddPage adds one applied page to s.
func (s *RunStats) AddPage(p Page, res ApplyResult) {
	s.Pages++
	s.Objects += len(p.Objects)
	s.New += res.New
	s.Updated += res.Updated
	s.Cost = s.Cost.Add(p.Cost)
	if n := len(p.Objects); n > 0 {
		s.Reached = p.Objects[n-1].UpdatedAt
	}
}

// JobCounts are what one run of a scheduled job counted, summed over its
// resources. Which are set depends on the job's kind: sync and backfill
// fill Pages to Updated, reconcile Missing and Behind, every emitting run
// Reemitted and Suppressed, maintenance Pruned; every run that calls the
// platform Requests and RateLimited. The scheduler makes them, the store
// keeps them, the CLI and the dashboard show them.
type JobCounts struct {
	Pages       int   `json:"pages"`
	Objects     int   `json:"objects"`
	New         int   `json:"new"`
	Updated     int   `json:"updated"`
	Missing     int   `json:"missing"`
	Behind      int   `json:"behind"`
	Reemitted   int   `json:"reemitted"`
	Suppressed  int   `json:"suppressed"`
	Pruned      int64 `json:"pruned"`
	Requests    int   `json:"requests"`
	RateLimited int   `json:"rate_limited"`
	// Orphans counts the objects the mirror holds that the platform no
	// longer lists, as a full reconcile counts them at its end; nil for a
	// run that did not count them (another kind, a reconcile that is not
	// full, or one that did not get to its end).
	Orphans *int `json:"orphans,omitempty"`
}

// ReconcileReport is what one reconciliation of one resource found and did.
// It lives in the root so that the engine (which makes it) and the store
// (which keeps it) share it without importing each other.
type ReconcileReport struct {
	Resource Resource
	// StartedAt is when the run began; the next run's default window is
	// measured from the StartedAt of the last successful one.
	StartedAt time.Time
	// Since is the start of the window compared; zero means the start of
	// the feed.
	Since time.Time
	// Full and DryRun are the run's options.
	Full, DryRun bool
	// Pages is the number of feed pages read.
	Pages int
	// Scanned counts the objects the platform returned in the window.
	Scanned int
	// Missing counts objects absent from the mirror, Behind objects whose
	// mirrored version is older than the platform's.
	Missing, Behind int
	// Reemitted counts events the emit path accepted, Suppressed those it
	// did not: duplicates, or versions superseded by a newer one that came
	// meanwhile (backstop.EmitSuperseded). Both stay zero in a dry run.
	Reemitted, Suppressed int
	// Orphans counts mirror objects the platform no longer returns; only a
	// Full run counts them.
	Orphans int
	Cost
	Duration time.Duration
	// Err is the error that stopped the run, nil when it finished.
	Err error
}
