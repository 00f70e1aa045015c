package localfleet

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Sample is one line of Prometheus' text format: a series and its value.
type Sample struct {
	// Name is the metric's name, e.g. "caddy_rate_limit_decisions_total".
	Name string
	// Labels are the series' label values by label name; empty, not nil,
	// for a series without labels.
	Labels map[string]string
	// Value is the sample's value, as written.
	Value float64
}

// Metrics is a scrape of a node's metrics endpoint.
type Metrics []Sample

// Metrics scrapes the node's /metrics on its admin endpoint.
func (n *Node) Metrics() (Metrics, error) {
	resp, err := client.Get("http://" + n.Admin + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %d %s", resp.StatusCode, body)
	}
	return ParseMetrics(string(body))
}

// ParseMetrics reads Prometheus' text format (without exemplars or
// timestamps, as Caddy writes it).
func ParseMetrics(text string) (Metrics, error) {
	var out Metrics
	for _, line := range strings.Split(text, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			return nil, fmt.Errorf("metrics line %q: no value", line)
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %v", line, err)
		}
		s := Sample{Labels: map[string]string{}, Value: v}
		name, rest, ok := strings.Cut(line[:sp], "{")
		s.Name = name
		if ok {
			for _, pair := range strings.Split(strings.TrimSuffix(rest, "}"), `",`) {
				k, val, _ := strings.Cut(pair, "=")
				s.Labels[k] = strings.Trim(val, `"`)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// Sum is the sum of the samples of name whose labels include the given
// pairs ("label", "value", ...).
func (m Metrics) Sum(name string, labels ...string) float64 {
	return m.By("", name, labels...)[""]
}

// By sums the samples of name whose labels include the given pairs, per
// value of the label by.
func (m Metrics) By(by, name string, labels ...string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range m {
		if s.Name != name {
			continue
		}
		match := true
		for i := 0; i+1 < len(labels); i += 2 {
			match = match && s.Labels[labels[i]] == labels[i+1]
		}
		if match {
			out[s.Labels[by]] += s.Value
		}
	}
	return out
}
