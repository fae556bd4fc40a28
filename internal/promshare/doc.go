// Package promshare registers the Prometheus collectors of components that
// may run several to a registerer (inbox consumers, side-effect
// dispatchers, drift checkers): the second one shares the first one's
// series instead of failing.
package promshare
