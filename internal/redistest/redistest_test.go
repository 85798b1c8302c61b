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

// A server whose port another test's server took in the meantime fails to
// start, instead of handing out the other server's address.
func TestStartRefusesAPortAnotherServerHolds(t *testing.T) {
	s := Start(t)
	other := &Server{t: t, bin: s.bin, dir: t.TempDir(), port: s.port}
	if err := other.start(); err == nil {
		other.Stop()
		t.Fatal("start on a port another redis-server holds succeeded")
	}
	if pid, err := serverPID(s.Addr()); err != nil || pid != s.cmd.Process.Pid {
		t.Errorf("the first server's pid is %d (%v), want %d", pid, err, s.cmd.Process.Pid)
	}
}
