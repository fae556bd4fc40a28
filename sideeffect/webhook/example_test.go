package webhook_test

import (
	"fmt"
	"time"

	"github.com/oncekit/oncekit/sideeffect/webhook"
)

// A receiver checks the Standard Webhooks signature of a request before it
// acts, and dedups on webhook-id.
func ExampleVerify() {
	key, _ := webhook.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	body := []byte(`{"order":"o-1"}`)
	sent := time.Now()
	sig := webhook.Sign(key, "effect-key", sent, body) // what the provider sends

	err := webhook.Verify(key, "effect-key", fmt.Sprint(sent.Unix()), sig, body, 5*time.Minute, time.Now())
	fmt.Println(err)
	// Output: <nil>
}

func ExampleNew() {
	p, err := webhook.New(&webhook.Config{
		URL:     "https://hooks.example.com/orders",
		Secret:  "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
		Timeout: 5 * time.Second,
	})
	fmt.Println(err, p.HonoursKeys())
	// Output: <nil> true
}
