package keyedmac

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"testing"
)

// GitHub's published vector, the parts given in pieces, and used from many
// goroutines at once: no state of one sum leaks into the next.
func TestSumMatchesHMAC(t *testing.T) {
	k := New([]byte("It's a Secret to Everybody"))
	const want = "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				var got []byte
				if (g+i)%2 == 0 {
					got = k.Sum(nil, []byte("Hello, World!"))
				} else {
					got = k.Sum([]byte("x"), []byte("Hello, "), []byte("World!"))[1:]
				}
				if hex.EncodeToString(got) != want {
					t.Errorf("Sum = %x, want %s", got, want)
					return
				}
			}
		})
	}
	wg.Wait()
	other := hmac.New(sha256.New, []byte("another key"))
	other.Write([]byte("body"))
	if got := New([]byte("another key")).Sum(nil, []byte("bo"), []byte("dy")); !hmac.Equal(got, other.Sum(nil)) {
		t.Errorf("Sum with another key = %x, want %x", got, other.Sum(nil))
	}
}

// The key is copied: changing the caller's slice afterwards changes
// nothing.
func TestNewCopiesTheKey(t *testing.T) {
	key := []byte("It's a Secret to Everybody")
	k := New(key)
	key[0] = 'X'
	if got := hex.EncodeToString(k.Sum(nil, []byte("Hello, World!"))); got != "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17" {
		t.Errorf("Sum after the caller changed its key = %s", got)
	}
}
