// Package keyedmac computes HMAC-SHA256 with a key hashed once: the
// webhook intake verifies every request with its secrets, and the
// dispatcher signs every attempt with its target's. hmac.New hashes the
// key's two pads each time it is called; a keyed hash that Reset brings
// back to its keyed state does not (a sixteenth of serve's CPU per
// webhook went to hmac.New).
package keyedmac

import (
	"crypto/hmac"
	"crypto/sha256"
	"hash"
	"slices"
	"sync"
)

// Key is one key's HMAC-SHA256. It is safe for concurrent use.
type Key struct{ pool sync.Pool }

// state is a keyed hash and the buffer it writes its sums into, so that
// the caller's dst need not escape to the heap.
type state struct {
	h   hash.Hash
	sum []byte
}

// New returns the HMAC-SHA256 of key (copied).
func New(key []byte) *Key {
	key = slices.Clone(key)
	k := &Key{}
	k.pool.New = func() any { return &state{h: hmac.New(sha256.New, key)} }
	return k
}

// Sum appends HMAC-SHA256(key, the parts one after another) to dst and
// returns the result.
func (k *Key) Sum(dst []byte, parts ...[]byte) []byte {
	st := k.pool.Get().(*state)
	st.h.Reset()
	for _, p := range parts {
		st.h.Write(p)
	}
	st.sum = st.h.Sum(st.sum[:0])
	dst = append(dst, st.sum...)
	k.pool.Put(st)
	return dst
}
