package groupcommit

// Queued returns how many submitted items wait for a commit.
func Queued[T, R any](w *Writer[T, R]) int { return len(w.in) }

// OnLinger makes w call f each time a batch starts to linger.
func OnLinger[T, R any](w *Writer[T, R], f func()) { w.lingering = f }
