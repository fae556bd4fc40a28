package fleet

import (
	"bytes"
	"context"
	"os"
	"time"

	"github.com/oncekit/oncekit/internal/wait"
)

// WatchFile reads the database list at path every interval and, when the
// file changed, gives it to Set, until ctx ends. A file that cannot be
// read or is refused (see ReadFile) is logged and counted nowhere else:
// the set in force stays until a good file replaces it. The caller reads
// the file once itself first (ReadFile, Set), to fail fast on a bad start.
func (f *Fleet) WatchFile(ctx context.Context, path string, interval time.Duration) {
	last, _ := os.ReadFile(path)
	wait.Every(ctx, interval, func(context.Context) {
		b, err := os.ReadFile(path)
		if err != nil || bytes.Equal(b, last) {
			if err != nil {
				f.log.Warn("reading the database list failed; keeping the set in force", "file", path, "err", err)
			}
			return
		}
		last = b
		dbs, err := parseList(path, b)
		if err == nil {
			err = f.Set(dbs)
		}
		if err != nil {
			f.log.Error("database list refused; keeping the set in force", "file", path, "err", err)
			return
		}
		f.log.Info("database list reloaded", "file", path, "databases", len(dbs))
	})
}
