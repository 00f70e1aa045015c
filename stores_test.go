package fleetlimit

import (
	"strings"
	"testing"
)

func TestStoreNames(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		redis *RedisConfig
		want  string
	}{
		{nil, "memory"},
		{&RedisConfig{Address: "10.0.0.1:6379", Password: "secret"}, "redis:10.0.0.1:6379"},
		{&RedisConfig{Address: "10.0.0.1:6379", DB: 2}, "redis:10.0.0.1:6379/2"},
		{&RedisConfig{Addresses: []string{"a:1", "b:2"}}, "cluster:a:1,b:2"},
		{&RedisConfig{Address: "a:1", Cluster: true}, "cluster:a:1"},
		{&RedisConfig{SentinelMaster: "mymaster", SentinelAddresses: []string{"s:26379"}}, "sentinel:mymaster"},
	} {
		h := &Handler{Redis: c.redis}
		if got := h.storeName(); got != c.want || strings.Contains(got, "secret") {
			t.Errorf("storeName(%+v) = %q, want %q", c.redis, got, c.want)
		}
	}
}
