package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuarb/gpuarb/internal/testutil"
)

// dashboard is the part of deploy/grafana/gpuarb-dashboard.json the test
// reads: each panel's queries and the template variables' queries.
type dashboard struct {
	Templating struct {
		List []struct {
			Name, Type, Query string
		}
	}
	Panels []struct {
		Title   string
		Targets []struct{ Expr string }
	}
}

// Every query of the Grafana dashboard returns data from a real
// Prometheus scraping the daemon while tenants run: a latency tenant with
// a GPU memory limit beside a batch one. Queries per tenant must return
// the running tenant's series; the template variables list it.
func TestDashboardQueriesReturnData(t *testing.T) {
	prom := testutil.Require(t, "prometheus", "apt-get install prometheus")
	data, err := os.ReadFile("../deploy/grafana/gpuarb-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash dashboard
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}

	gpu := testutil.StartFakeGPU(t)
	svc, batch := testutil.NewCgroup(t, "dash-svc"), testutil.NewCgroup(t, "dash-batch")
	dir := t.TempDir()
	pol := fmt.Sprintf(`tenants:
  - {name: svc, cgroup: %s, priority: latency, slo: {p99_sync_ms: 20}, memory_limit: 1GiB}
  - {name: batch, cgroup: %s}
`, svc.Rel, batch.Rel)
	if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte(pol), 0o644); err != nil {
		t.Fatal(err)
	}
	metricsAddr := testutil.FreeTCPAddr(t)
	startDaemonIn(t, gpu, dir, "--metrics-addr", metricsAddr)
	testutil.Start(t, svc, gpu.Workload(t, "infer", "--rate", "50", "--duration", "60"))
	testutil.Start(t, batch, gpu.Workload(t, "hog", "--duration", "60"))

	promAddr := testutil.FreeTCPAddr(t)
	conf := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: gpuarb
    static_configs: [{targets: [%q]}]
`, metricsAddr)), 0o644); err != nil {
		t.Fatal(err)
	}
	p := testutil.Start(t, nil, exec.Command(prom, "--config.file", conf, "--storage.tsdb.path", filepath.Join(dir, "tsdb"),
		"--web.listen-address", promAddr))
	version, _ := exec.Command(prom, "--version").Output()
	t.Logf("%s", strings.SplitN(string(version), "\n", 2)[0])

	// Grafana's variables, as a query run against all tenants and GPUs.
	expand := strings.NewReplacer(`$tenant`, `.*`, `$gpu`, `.*`, `$__rate_interval`, `15s`)
	type check struct{ what, expr string }
	var checks []check
	for _, panel := range dash.Panels {
		for _, tg := range panel.Targets {
			checks = append(checks, check{panel.Title, expand.Replace(tg.Expr)})
		}
	}
	if len(checks) < 10 {
		t.Fatalf("the dashboard has %d queries", len(checks))
	}
	deadline := time.Now().Add(45 * time.Second)
	for _, c := range checks {
		for {
			series, err := promQuery(promAddr, c.expr)
			wantSvc := strings.Contains(c.expr, "tenant=~")
			if err == nil && len(series) > 0 && (!wantSvc || slices.Contains(series, "svc")) {
				t.Logf("%s: %s: %d series", c.what, c.expr, len(series))
				break
			}
			if time.Now().After(deadline) || p.Done() {
				_, stderr := p.Output()
				t.Fatalf("panel %q: %s returned %v (%v), want a series (of tenant svc where it selects tenants)\n%s", c.what, c.expr, series, err, tailOf(stderr, 2000))
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		metric, label, ok := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(v.Query, "label_values("), ")"), ", ")
		if !ok {
			t.Errorf("variable %s: query %q is not label_values(METRIC, LABEL)", v.Name, v.Query)
			continue
		}
		values, err := promLabelValues(promAddr, label, metric)
		want := map[string]string{"tenant": "svc", "gpu": "0"}[label]
		if err != nil || !slices.Contains(values, want) {
			t.Errorf("variable %s (%s): %v (%v), want %q among them", v.Name, v.Query, values, err, want)
		}
	}
}

// promQuery runs an instant query and returns each series' tenant label
// ("" for series without one).
func promQuery(addr, expr string) ([]string, error) {
	var r struct {
		Status string
		Error  string
		Data   struct {
			Result []struct{ Metric map[string]string }
		}
	}
	if err := getJSON("http://"+addr+"/api/v1/query?query="+url.QueryEscape(expr), &r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", expr, r.Error)
	}
	var out []string
	for _, s := range r.Data.Result {
		out = append(out, s.Metric["tenant"])
	}
	return out, nil
}

// promLabelValues lists the values of label on metric's series.
func promLabelValues(addr, label, metric string) ([]string, error) {
	var r struct {
		Status string
		Data   []string
	}
	if err := getJSON("http://"+addr+"/api/v1/label/"+label+"/values?match[]="+url.QueryEscape(metric), &r); err != nil {
		return nil, err
	}
	return r.Data, nil
}

func getJSON(u string, v any) error {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
