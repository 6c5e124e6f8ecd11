package plugin

// Abandon drops h as a server killed at once would: it stops watching the
// plugin and closes the connection, and leaves the process running.
func Abandon(h *Driver) {
	h.mu.Lock()
	c := h.cur
	h.cur, h.closed = nil, true
	h.mu.Unlock()
	close(h.done)
	h.wg.Wait()
	if c != nil {
		_ = c.cc.Close()
	}
}
