package attach

// SetCrashAfterCommit makes upgrades stop right after their commit point,
// as if the process died there, while on is true.
func SetCrashAfterCommit(on bool) {
	crashAfterCommit = nil
	if on {
		crashAfterCommit = func() bool { return true }
	}
}

// CheckBPFFS is checkBPFFS, for tests.
func CheckBPFFS(dir string) error { return checkBPFFS(dir) }
