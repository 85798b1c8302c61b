package redistest

import "testing"

func TestStopAndRestartOnTheSamePort(t *testing.T) {
	s := Start(t)
	if err := ping(s.Addr()); err != nil {
		t.Fatalf("started server does not answer: %v", err)
	}
	addr := s.Addr()
	s.Stop()
	if err := ping(addr); err == nil {
		t.Fatal("stopped server still answers PING")
	}
	s.Restart()
	if s.Addr() != addr {
		t.Fatalf("restarted on %s, want %s", s.Addr(), addr)
	}
	if err := ping(addr); err != nil {
		t.Fatalf("restarted server does not answer: %v", err)
	}
}
