package leader

// SetAfterRead sets the hook that runs between Watch's read and its watch,
// and returns what puts the previous one back.
func SetAfterRead(f func()) (restore func()) {
	old := afterRead
	afterRead = f
	return func() { afterRead = old }
}
