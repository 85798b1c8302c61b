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
}
