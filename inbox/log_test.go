package inbox_test

import (
	"io"
	"log/slog"
	"os"
)

func testLogger() *slog.Logger {
	if os.Getenv("INBOX_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
