package rlsload

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// service answers OK to the value "hot", OVER_LIMIT to any other, and
// past the caller's deadline to the value "slow".
type service struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	switch req.GetDescriptors()[0].GetEntries()[0].GetValue() {
	case "hot":
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
	case "slow":
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}, nil
}

func serve(t *testing.T) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(srv, service{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// The deadline is long: the machine may be loaded, and this test is about
// the counts.
func TestRunCountsEachAnswer(t *testing.T) {
	conn := serve(t)
	hot, err := Run(t.Context(), conn, Load{Domain: "d", Key: "k", Keys: 1, Callers: 4, Deadline: 5 * time.Second, Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if hot.Calls == 0 || hot.OK != hot.Calls || hot.OverLimit+hot.Missed+hot.Errors != 0 {
		t.Errorf("one hot key: %+v, want every call OK", hot)
	}
	if hot.P50 <= 0 || hot.P50 > hot.P99 || hot.P99 > hot.Max {
		t.Errorf("latencies p50 %s, p99 %s, max %s: want 0 < p50 <= p99 <= max", hot.P50, hot.P99, hot.Max)
	}
	many, err := Run(t.Context(), conn, Load{Domain: "d", Key: "k", Keys: 1000, Callers: 4, Deadline: 5 * time.Second, Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if many.Calls == 0 || many.OverLimit != many.Calls {
		t.Errorf("1000 keys: %+v, want every call OVER_LIMIT (no value is hot)", many)
	}
}

func TestRunCountsMissedDeadlines(t *testing.T) {
	conn := serve(t)
	l := Load{Domain: "d", Key: "k", Keys: 1, Value: "slow", Callers: 2, Deadline: 5 * time.Millisecond, Duration: 200 * time.Millisecond}
	r, err := Run(t.Context(), conn, l)
	if err != nil {
		t.Fatal(err)
	}
	if r.Calls == 0 || r.Missed != r.Calls || r.FailedShare() != 1 {
		t.Errorf("a service that never answers in time: %+v, want every call missed", r)
	}
	if r.P50 < 5*time.Millisecond {
		t.Errorf("p50 %s of calls that all waited for a 5 ms deadline", r.P50)
	}
}

func TestRunRefusesAnIncompleteLoad(t *testing.T) {
	if _, err := Run(t.Context(), nil, Load{Key: "k", Duration: time.Second}); err == nil || !strings.Contains(err.Error(), "domain") {
		t.Errorf("a load without a domain: error %v", err)
	}
}
