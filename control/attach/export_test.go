package attach

// CrashAfterCommit makes upgrades stop right after their commit point, as
// if the process died there, until the test ends.
func CrashAfterCommit(tb interface{ Cleanup(func()) }) {
	crashAfterCommit = func() bool { return true }
	tb.Cleanup(func() { crashAfterCommit = nil })
}
