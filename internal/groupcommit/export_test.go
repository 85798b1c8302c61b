package groupcommit

// Queued returns how many submitted items wait for a commit.
func Queued[T, R any](w *Writer[T, R]) int { return len(w.in) }
