package inbox

// InHand returns how many messages c holds, received and not yet settled
// with the broker, for tests that wait for the source to hand messages over.
func InHand(c *Consumer) int {
	items, _ := c.inHand.snapshot()
	return len(items)
}
