// Package fleet runs the outbox relays of many databases in a fleet of
// processes: each member serves the databases assigned to it, and each
// database is served by k members, not by all of them.
//
// A Fleet is given the set of databases (Set, or ReadFile and WatchFile for
// a file operators edit) and may be given a new set at any time: relays of
// added databases start and those of removed ones stop, without a restart.
// Members find each other through a JetStream key-value bucket in which each
// keeps an entry alive (its TTL is the server's, so members' clocks do not
// matter), and AssignSpread picks a database's k members by rendezvous
// hashing, in k different groups (Config.Group: a process, host or zone)
// while there are that many: a member joining or leaving moves about 1/n
// of the assignments, and only those that involve it, and a group's death
// takes at most one of a database's members.
//
// The fleet decides only who tries. Correctness stays in each database: an
// outbox.Relay per assigned database shares that database's partitions with
// the other members assigned to it through the partition leases and fencing
// tokens kept beside the cursors, so two members that briefly both believe
// they own a database (a membership change seen at different moments, a
// member cut off from NATS) publish nothing twice.
//
// Each database is isolated from the others: its relay runs on its own
// goroutines and pool, a database that refuses or hangs connections is
// retried with its own backoff (a breaker per database, whose state the
// metrics report with a database label), and a slow one never delays
// another's events. A member opens at most Budget connections to each
// database it serves, in proportion to the partitions it holds there.
package fleet
