// Package promqlcheck runs gpushare's PromQL through Prometheus's own parser and engine.
//
// It is compiled once into a test binary (harness/controlplane/build.sh, `go test -c`) and run
// by tests/integration/test_promql_engine.py, which writes what to check into PROMQLCHECK_DIR:
//
//   - exprs.json: [{"name": ..., "expr": ...}], each parsed with the options Prometheus 3
//     serves queries with; an error names the expression;
//   - *.test: promqltest scripts (load series, eval an expression at a time, expect samples),
//     run on the real engine over an in-memory TSDB;
//   - queries.json: [{"name", "load", "expr", "at"}], a promqltest load block and an instant
//     query at "at" seconds; the engine's answers go to results.json, [{"name", "error",
//     "samples": [{"labels", "value"}]}], for the Python tests to compare as they need.
//
// A promqltest binary needs Prometheus's promql and tsdb packages only, where promtool pulls in
// every service discovery and their cloud SDKs (23 minutes cold on 2 cores).
package promqlcheck

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
)

type named struct {
	Name string `json:"name"`
	Expr string `json:"expr"`
}

func dir(t *testing.T) string {
	d := os.Getenv("PROMQLCHECK_DIR")
	if d == "" {
		t.Fatal("PROMQLCHECK_DIR is not set: give the folder holding exprs.json and *.test files")
	}
	return d
}

func TestParse(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(dir(t), "exprs.json"))
	if os.IsNotExist(err) {
		t.Skip("no exprs.json")
	}
	if err != nil {
		t.Fatal(err)
	}
	var exprs []named
	if err := json.Unmarshal(raw, &exprs); err != nil {
		t.Fatalf("exprs.json: %v", err)
	}
	p := parser.NewParser(parser.Options{})
	for _, e := range exprs {
		if _, err := p.ParseExpr(e.Expr); err != nil {
			t.Errorf("%s: %v\n    %s", e.Name, err, e.Expr)
		}
	}
	t.Logf("parsed %d expressions", len(exprs))
}

func TestScripts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(dir(t), "*.test"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	if len(files) == 0 {
		t.Skip("no *.test files")
	}
	for _, f := range files {
		script, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(filepath.Base(f), func(t *testing.T) {
			engine := promqltest.NewTestEngine(t, false, 5*time.Minute, 50000000)
			promqltest.RunTest(t, string(script), engine)
		})
	}
}

type query struct {
	Name string  `json:"name"`
	Load string  `json:"load"`
	Expr string  `json:"expr"`
	At   float64 `json:"at"`
}

type sample struct {
	Labels map[string]string `json:"labels"`
	Value  float64           `json:"value"`
}

type answer struct {
	Name    string   `json:"name"`
	Error   string   `json:"error,omitempty"`
	Samples []sample `json:"samples"`
}

func TestEval(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(dir(t), "queries.json"))
	if os.IsNotExist(err) {
		t.Skip("no queries.json")
	}
	if err != nil {
		t.Fatal(err)
	}
	var queries []query
	if err := json.Unmarshal(raw, &queries); err != nil {
		t.Fatalf("queries.json: %v", err)
	}
	engine := promqltest.NewTestEngine(t, false, 5*time.Minute, 50000000)
	answers := make([]answer, 0, len(queries))
	for _, q := range queries {
		answers = append(answers, evaluate(t, engine, q))
	}
	out, err := json.Marshal(answers)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir(t), "results.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
}

func evaluate(t *testing.T, engine *promql.Engine, q query) answer {
	store := promqltest.LoadedStorage(t, q.Load)
	defer store.Close()
	at := time.Unix(0, 0).Add(time.Duration(q.At * float64(time.Second))).UTC()
	got := answer{Name: q.Name, Samples: []sample{}}
	qry, err := engine.NewInstantQuery(context.Background(), store, nil, q.Expr, at)
	if err != nil {
		got.Error = err.Error()
		return got
	}
	defer qry.Close()
	res := qry.Exec(context.Background())
	if res.Err != nil {
		got.Error = res.Err.Error()
		return got
	}
	switch v := res.Value.(type) {
	case promql.Vector:
		for _, s := range v {
			got.Samples = append(got.Samples, sample{Labels: s.Metric.Map(), Value: s.F})
		}
	case promql.Scalar:
		got.Samples = append(got.Samples, sample{Labels: map[string]string{}, Value: v.V})
	default:
		got.Error = "not an instant vector or scalar: " + string(res.Value.Type())
	}
	return got
}
