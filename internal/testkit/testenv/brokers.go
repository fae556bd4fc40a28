package testenv

import (
	"net"
	"net/url"
	"os"
	"testing"
	"time"
)

// DefaultRabbitMQURL is used when RABBITMQ_URL is not set.
const DefaultRabbitMQURL = "amqp://guest:guest@127.0.0.1:5672/"

// DefaultRedisAddr is used when REDIS_ADDR is not set.
const DefaultRedisAddr = "127.0.0.1:6379"

// RabbitMQURL returns RABBITMQ_URL or the local default, failing the test
// (never skipping it) when nothing listens there.
func RabbitMQURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("RABBITMQ_URL")
	if u == "" {
		u = DefaultRabbitMQURL
	}
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatalf("RABBITMQ_URL does not parse")
	}
	reachable(t, "RabbitMQ", pu.Host, "/etc/init.d/rabbitmq-server start")
	return u
}

// RedisAddr returns REDIS_ADDR or the local default, failing the test
// (never skipping it) when nothing listens there.
func RedisAddr(t testing.TB) string {
	t.Helper()
	a := os.Getenv("REDIS_ADDR")
	if a == "" {
		a = DefaultRedisAddr
	}
	reachable(t, "Redis", a, "/etc/init.d/redis-server start")
	return a
}

func reachable(t testing.TB, what, addr, start string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("%s is not reachable at %s (%v): start it with `%s` (.ci/run does), or point the tests elsewhere", what, addr, err, start)
	}
	_ = c.Close()
}
