package governor

import (
	"context"
	"sync"
	"time"
)

// Store holds the budgets of API keys and applies Budget's rules to them
// atomically. Keys are KeyID values, never API keys. Implementations are safe
// for concurrent use; a shared implementation (Redis) makes every process
// that uses it share one budget per key.
type Store interface {
	// Reserve runs Budget.Reserve on the key's budget at now: either the
	// request is counted in flight (granted) or wait says when to ask again.
	Reserve(ctx context.Context, key string, now time.Time, p Policy) (wait time.Duration, granted bool, err error)
	// Observe runs Budget.Observe on the key's budget at now, releasing the
	// in-flight slot of one granted request.
	Observe(ctx context.Context, key string, now time.Time, obs Observation, p Policy) error
	// Snapshot returns the key's state at now without changing it.
	Snapshot(ctx context.Context, key string, now time.Time, p Policy) (State, error)
}

// PauseLifter is a Store that can end a key's 429 pause before its time
// (Governor.LiftPause). The stores of this package all are.
type PauseLifter interface {
	LiftPause(ctx context.Context, key string, now time.Time, p Policy) error
}

// MemoryStore is a Store for one process. The zero value is ready to use.
type MemoryStore struct {
	mu      sync.Mutex
	budgets map[string]*Budget
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{} }

func (s *MemoryStore) budget(key string) *Budget {
	if s.budgets == nil {
		s.budgets = make(map[string]*Budget)
	}
	b := s.budgets[key]
	if b == nil {
		b = &Budget{}
		s.budgets[key] = b
	}
	return b
}

// Reserve implements Store. It never fails.
func (s *MemoryStore) Reserve(_ context.Context, key string, now time.Time, p Policy) (time.Duration, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	wait, ok := s.budget(key).Reserve(now, p)
	return wait, ok, nil
}

// Observe implements Store. It never fails.
func (s *MemoryStore) Observe(_ context.Context, key string, now time.Time, obs Observation, p Policy) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.budget(key).Observe(now, obs, p)
	return nil
}

// Snapshot implements Store. It never fails; an unknown key shows the seed.
func (s *MemoryStore) Snapshot(_ context.Context, key string, now time.Time, p Policy) (State, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b Budget
	if cur := s.budgets[key]; cur != nil {
		b = *cur
	}
	return b.State(now, p), nil
}

// LiftPause implements PauseLifter. It never fails.
func (s *MemoryStore) LiftPause(_ context.Context, key string, _ time.Time, _ Policy) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.budget(key).LiftPause()
	return nil
}
