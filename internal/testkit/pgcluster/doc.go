// Package pgcluster starts throwaway PostgreSQL clusters for test harnesses
// and benchmarks: initdb into a fresh directory, the caller's settings, its
// own port, removed on Close. The chaos run crashes one with an immediate
// stop; the scale benchmark runs on one configured for a large history.
package pgcluster
