package api

import (
	"fmt"
	"net/http"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
)

// Bounds of a rebalance plan's answer.
const (
	MaxRebalanceMoves = 100_000
	MaxRebalanceStays = 10_000
)

// rebalancePlan answers a rebalance plan (control.RebalanceOptions in the
// body): an operator's plan moves only the instances of its namespaces,
// an admin's any instance. Nothing is changed.
func (s *Server) rebalancePlan(w http.ResponseWriter, r *http.Request) error {
	var opt control.RebalanceOptions
	if err := decodeBody(w, r, s.maxBody, &opt); err != nil {
		return err
	}
	if opt.MaxMoves > MaxRebalanceMoves {
		return &driver.FieldError{Path: "max_moves", Reason: fmt.Sprintf("%d: this server plans at most %d moves at once", opt.MaxMoves, MaxRebalanceMoves)}
	}
	if opt.MaxStays > MaxRebalanceStays {
		return &driver.FieldError{Path: "max_stays", Reason: fmt.Sprintf("%d: this server lists at most %d", opt.MaxStays, MaxRebalanceStays)}
	}
	if c := caller(r); !c.All() {
		// No namespace matches "/": a token without namespaces moves
		// nothing.
		opt.Owners = append([]string{"/"}, c.Namespaces...)
	}
	ans, err := s.plane.PlanRebalance(r.Context(), opt)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, ans)
}

// rebalanceApply plans a rebalance and starts carrying it out
// (control.ApplyOptions in the body), within the caller's namespaces as
// rebalancePlan; it answers the run.
func (s *Server) rebalanceApply(w http.ResponseWriter, r *http.Request) error {
	var opt control.ApplyOptions
	if err := decodeBody(w, r, s.maxBody, &opt); err != nil {
		return err
	}
	if opt.MaxStays > MaxRebalanceStays {
		return &driver.FieldError{Path: "max_stays", Reason: fmt.Sprintf("%d: this server lists at most %d", opt.MaxStays, MaxRebalanceStays)}
	}
	if c := caller(r); !c.All() {
		opt.Owners = append([]string{"/"}, c.Namespaces...)
	}
	run, err := s.plane.ApplyRebalance(r.Context(), opt)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusAccepted, visibleRun(r, run))
}

// rebalanceStatus answers the current or latest rebalance run; a caller
// that does not see every namespace sees the moves of its own.
func (s *Server) rebalanceStatus(w http.ResponseWriter, r *http.Request) error {
	if err := onlyParams(r.URL.Query()); err != nil {
		return err
	}
	run, err := s.plane.RebalanceStatus(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, visibleRun(r, run))
}

// visibleRun is run as the caller may see it (RebalanceRun.For).
func visibleRun(r *http.Request, run *control.RebalanceRun) *control.RebalanceRun {
	c := caller(r)
	if c.All() {
		return run
	}
	return run.For(c.Sees)
}
