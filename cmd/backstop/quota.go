package main

import (
	"context"
	"sync"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources/governor"
	"github.com/backstop-sync/backstop/store"
)

// quotaMeter is the platform source, counting what its calls cost: the
// requests, 429s and throttle waits the quota samples (and the dashboard's
// Quota page) show. Every command that calls the platform goes through
// one, so a nightly `backstop sync` from system cron is counted as well as
// serve's own jobs.
type quotaMeter struct {
	backstop.Source

	mu   sync.Mutex
	cost backstop.Cost // since the last take
}

var _ backstop.Source = (*quotaMeter)(nil)

func (m *quotaMeter) add(c backstop.Cost) {
	m.mu.Lock()
	m.cost = m.cost.Add(c)
	m.mu.Unlock()
}

// take returns what was counted since the last take and starts again.
func (m *quotaMeter) take() backstop.Cost {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.cost
	m.cost = backstop.Cost{}
	return c
}

// List calls the source's List and counts its cost, also when it failed.
func (m *quotaMeter) List(ctx context.Context, req backstop.ListRequest) (backstop.Page, error) {
	p, err := m.Source.List(ctx, req)
	m.add(p.Cost)
	return p, err
}

// Get calls the source's Get and counts its cost, also when it failed.
func (m *quotaMeter) Get(ctx context.Context, r backstop.Resource, id string) (backstop.Object, backstop.Cost, error) {
	o, c, err := m.Source.Get(ctx, r, id)
	m.add(c)
	return o, c, err
}

// saveQuotaSample stores the governor's budget st at now with what the
// meter counted since its last sample. What could not be stored is counted
// again in the next sample.
func saveQuotaSample(ctx context.Context, db *store.DB, gov *governor.Governor, m *quotaMeter, now time.Time, st governor.State) error {
	c := m.take()
	err := db.SaveQuotaSample(ctx, store.QuotaSample{
		KeyID: gov.KeyID(), At: now, Limit: st.Limit, Remaining: st.Remaining, Reset: st.Reset,
		PausedUntil: st.PausedUntil, Requests: c.Requests, RateLimited: c.RateLimited, ThrottleWait: c.ThrottleWait,
	})
	if err != nil {
		m.add(c)
	}
	return err
}

// quotaSaveTimeout bounds the last quota sample a command stores as it
// closes.
const quotaSaveTimeout = 5 * time.Second

// saveLastQuotaSample stores, when a command closes, what its platform
// calls cost since serve's sampler (or nothing) last stored it; a command
// that made no request stores nothing.
func (a *app) saveLastQuotaSample() {
	if a.meter == nil || a.gov == nil {
		return
	}
	a.meter.mu.Lock()
	none := a.meter.cost == (backstop.Cost{})
	a.meter.mu.Unlock()
	if none {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), quotaSaveTimeout)
	defer cancel()
	st, err := a.gov.State(ctx)
	if err == nil {
		err = saveQuotaSample(ctx, a.db, a.gov, a.meter, time.Now(), st)
	}
	if err != nil {
		a.log.Warn("quota sample", "err", err)
	}
}
