package web_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/berth-dev/berth/driver"
	"github.com/berth-dev/berth/scheduler"
)

var rowRE = regexp.MustCompile(`<tr data-id="`)

// TestPages renders every page for an empty cluster, a small one and one
// of 10,000 instances, and checks what each shows.
func TestPages(t *testing.T) {
	clusters := []struct {
		name      string
		nodes     int
		instances int
	}{
		{"empty", 0, 0},
		{"small", 3, 5},
		{"10000", 100, 10_000},
	}
	for _, cl := range clusters {
		t.Run(cl.name, func(t *testing.T) {
			plane := simPlane(t, max(cl.nodes, 1))
			if cl.instances > 0 {
				submit(t, plane, "team-a", "r", cl.instances, nil)
			}
			if cl.name == "small" {
				// The nodes full, one more waits for room.
				submit(t, plane, "team-a", "fill", 3, func(r *scheduler.Request) { r.CPU = driver.CPUs(3.9) })
				submit(t, plane, "team-a", "big", 1, func(r *scheduler.Request) { r.CPU = driver.CPUs(1); r.Constraints = []string{"disk==ssd"} })
				one := 1
				svc := scheduler.Service{Request: scheduler.Request{Count: 3, Spec: driver.Spec{Name: "worker", Image: "berth/sim",
					Resources: driver.Resources{CPU: driver.CPUs(0.01), Memory: driver.MiB}}}, Essential: &one}
				if _, err := plane.SubmitGroup(context.Background(), scheduler.Group{ID: "job", Services: []scheduler.Service{svc}}, "team-a"); err != nil {
					t.Fatal(err)
				}
			}
			s := newWeb(t, plane, nil)

			wantBody(t, get(s, "/ui/", "admin-secret"), http.StatusOK, "Overview", "Providers", "Nodes of sim", "Quota use per namespace", "team-a")
			if cl.nodes > 0 {
				wantBody(t, get(s, "/ui/", "admin-secret"), http.StatusOK, fmt.Sprintf("%d nodes", cl.nodes))
			}

			body := wantBody(t, get(s, "/ui/instances", "admin-secret"), http.StatusOK, `<label for="f-ns">Namespace</label>`)
			rows := len(rowRE.FindAllString(body, -1))
			wantRows := min(cl.instances+map[bool]int{true: 3 + 1 + 3}[cl.name == "small"], web100) // the fillers, the waiting one and the group
			if rows != wantRows {
				t.Errorf("instances page: %d rows, want %d", rows, wantRows)
			}
			if cl.instances == 0 {
				wantBody(t, get(s, "/ui/instances", "admin-secret"), http.StatusOK, "No instances match.")
			}
			if cl.instances > web100 {
				if !strings.Contains(body, `rel="next"`) {
					t.Error("a full page has no next link")
				}
				// Walk every page at the largest page size.
				seen, after := 0, ""
				for {
					w := get(s, "/ui/instances?limit=10000"+after, "admin-secret")
					b := wantBody(t, w, http.StatusOK)
					seen += len(rowRE.FindAllString(b, -1))
					m := regexp.MustCompile(`href="/ui/instances\?([^"]*after=[^"]*)" rel="next"`).FindStringSubmatch(b)
					if m == nil {
						break
					}
					after = "&after=" + regexp.MustCompile(`after=([^&]*)`).FindStringSubmatch(strings.ReplaceAll(m[1], "&amp;", "&"))[1]
				}
				if seen != cl.instances {
					t.Errorf("pages hold %d instances, want %d", seen, cl.instances)
				}
			}

			if cl.instances > 0 {
				wantBody(t, get(s, "/ui/instances/r-0", "admin-secret"), http.StatusOK, "r-0", "berth/sim", "History", `id="logs"`, "act-stop")
			} else {
				wantBody(t, get(s, "/ui/instances/r-0", "admin-secret"), http.StatusNotFound, "404")
			}

			pend := wantBody(t, get(s, "/ui/pending", "admin-secret"), http.StatusOK, "Why they wait")
			if cl.name == "small" {
				if !strings.Contains(pend, "not enough cpu") {
					t.Errorf("pending page does not say why big waits:\n%s", cut(pend))
				}
				// The group: 3 instances, 1 essential, 2 elastic.
				if !regexp.MustCompile(`Group job: [a-z]+.*\n.*\n<tbody><tr><th scope="row">[^<]+</th><td>3</td><td>1</td><td>2</td>`).MatchString(pend) {
					t.Errorf("pending page does not show group job with 3 instances, 1 essential, 2 elastic:\n%s", cut(pend[strings.Index(pend, "Groups"):]))
				}
			} else if !strings.Contains(pend, "Nothing waits.") {
				t.Errorf("pending page shows waiting instances in a cluster where all fit")
			}

			wantBody(t, get(s, "/ui/whatif", "admin-secret"), http.StatusOK, "Simulated nodes", "built-in w2")
			wantBody(t, get(s, "/ui/signin", ""), http.StatusOK, `<label for="token">Token</label>`)
		})
	}
}

// web100 is the dashboard's default page size.
const web100 = 100

// TestSecretsShownAsDigests: env values, user data and config file
// contents never appear on the instance page, only their size and digest.
func TestSecretsShownAsDigests(t *testing.T) {
	plane := simPlane(t, 1)
	secrets := []string{"hunter2-env-value", "user-data-secret", "config-file-secret"}
	submit(t, plane, "team-a", "s", 1, func(r *scheduler.Request) {
		r.Spec.Env = map[string]string{"PASSWORD": secrets[0]}
		r.Spec.UserData = secrets[1]
		r.Spec.ConfigFiles = []driver.ConfigFile{{Path: "/etc/app.conf", Content: secrets[2]}}
	})
	s := newWeb(t, plane, nil)
	body := wantBody(t, get(s, "/ui/instances/s", "admin-secret"), http.StatusOK, "PASSWORD", "/etc/app.conf")
	for _, v := range secrets {
		if strings.Contains(body, v) {
			t.Errorf("the page shows the secret %q", v)
		}
		sum := sha256.Sum256([]byte(v))
		if want := fmt.Sprintf("%d bytes, sha256:%s", len(v), hex.EncodeToString(sum[:])); !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}

// TestOverviewListsNodesInPages: the overview lists the first 500 nodes of
// a provider, counts them all, and lists them all when asked.
func TestOverviewListsNodesInPages(t *testing.T) {
	plane := simPlane(t, 2000)
	s := newWeb(t, plane, nil)
	nodeRow := regexp.MustCompile(`<tr><th scope="row">[^<]+</th><td><span class="state`)
	body := wantBody(t, get(s, "/ui/", "admin-secret"), http.StatusOK, "2000 nodes", "sim: 2000 nodes, the first 500 listed", `href="/ui/?nodes=all"`)
	if n := len(nodeRow.FindAllString(body, -1)); n != 500 {
		t.Errorf("the overview lists %d nodes, want 500", n)
	}
	body = wantBody(t, get(s, "/ui/?nodes=all", "admin-secret"), http.StatusOK, "sim: 2000 nodes;")
	if n := len(nodeRow.FindAllString(body, -1)); n != 2000 {
		t.Errorf("the overview with nodes=all lists %d nodes, want 2000", n)
	}
	wantBody(t, get(s, "/ui/?nodes=many", "admin-secret"), http.StatusBadRequest, "want all")
	wantBody(t, get(s, "/ui/?node=all", "admin-secret"), http.StatusBadRequest, "unknown query parameter")
}

// TestEventsUsageParameter: the event stream takes usage=1 only.
func TestEventsUsageParameter(t *testing.T) {
	s := newWeb(t, simPlane(t, 1), nil)
	wantBody(t, get(s, "/ui/events?usage=yes", "admin-secret"), http.StatusBadRequest, "usage &#34;yes&#34;: want 1")
	wantBody(t, get(s, "/ui/events?usage=1&since=4", "admin-secret"), http.StatusBadRequest, "known: instance, usage")
}
