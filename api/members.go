package api

// Member is one member of the etcd cluster that keeps a highly available
// Berth cluster's state (GET /v1/members).
type Member struct {
	// ID is the member's id, in hexadecimal.
	ID         string   `json:"id"`
	Name       string   `json:"name"`
	PeerURLs   []string `json:"peer_urls"`
	ClientURLs []string `json:"client_urls"`
	// Learner is set for a member that does not vote yet.
	Learner bool `json:"learner,omitempty"`
}

// MemberRequest adds a member (POST /v1/members): its peer URL. The new
// member is then started with --etcd-initial-cluster-state existing.
type MemberRequest struct {
	PeerURL string `json:"peer_url"`
}
