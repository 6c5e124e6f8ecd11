package web

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/control"
	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
)

// rebalanceShown bounds the moves and stays the rebalance page lists.
const rebalanceShown = 200

// rebalanceData is the rebalance page: a plan and its effect, computed
// when the page is asked for (nothing moves), and the latest run.
type rebalanceData struct {
	Goal      string
	Threshold string
	Error     string
	Plan      *control.RebalanceAnswer
	Moves     []scheduler.Move
	Stays     []scheduler.Stay
	Run       *control.RebalanceRun
	RunDone   int
}

// rebalance shows a rebalance plan (GET /ui/rebalance?goal=&threshold=):
// the moves, the nodes freed or the loads before and after, why what
// stays stays, and the plan's replay. Planning costs the server CPU, as a
// what-if run does: operators and admins only, as the API's route. A
// caller who does not see every namespace plans the moves of its own.
func (s *Server) rebalance(w http.ResponseWriter, r *http.Request, c *caller) error {
	role := string(c.Role)
	if role != "admin" && role != "operator" {
		return errDenied
	}
	// Every namespace: an admin, or a token of "*".
	all := role == "admin" || slices.Contains(c.Namespaces, "*")
	q := r.URL.Query()
	d := rebalanceData{Goal: q.Get("goal"), Threshold: q.Get("threshold")}
	opt := control.RebalanceOptions{Goal: scheduler.RebalanceGoal(d.Goal), MaxStays: rebalanceShown}
	if d.Threshold != "" {
		f, err := strconv.ParseFloat(strings.TrimSpace(d.Threshold), 64)
		if err != nil {
			d.Error = fmt.Sprintf("threshold %q: want a number between 0 and 1", d.Threshold)
		}
		opt.Threshold = f
	}
	if !all {
		opt.Owners = append([]string{"/"}, c.Namespaces...)
	}
	if d.Error == "" {
		ans, err := s.plane.PlanRebalance(r.Context(), opt)
		switch {
		case errors.Is(err, driver.ErrInvalid):
			d.Error = err.Error()
		case err != nil:
			return err
		default:
			d.Plan = ans
			d.Moves = ans.Moves[:min(len(ans.Moves), rebalanceShown)]
			d.Stays = ans.Stays
		}
	}
	if run, err := s.plane.RebalanceStatus(r.Context()); err == nil {
		if !all {
			run = run.For(func(ns string) bool { return slices.Contains(c.Namespaces, ns) })
		}
		for _, m := range run.Moves {
			if m.State == control.MoveDone {
				d.RunDone++
			}
		}
		d.Run = run
	}
	return s.render(w, http.StatusOK, "rebalance", s.frame(c, "Rebalance", "rebalance", d))
}
