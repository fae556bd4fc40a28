package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// FailoverStandby makes a streaming standby of p that a failover may
// promote with the logical slots it keeps: p gets a physical replication
// slot named slot, which the standby streams through (primary_slot_name)
// with hot_standby_feedback on and a primary_conninfo naming a database.
// On PostgreSQL 17 the standby also synchronizes p's failover slots
// (sync_replication_slots = on) and p waits for the standby before it
// sends logical changes on (synchronized_standby_slots = slot): the
// settings docs/operations.md lists for a failover that keeps the logical
// relay's slot. Before 17 those two settings do not exist and are left out.
// p must run with wal_level = logical (or replica) and room for a WAL
// sender and a slot.
//
// The base backup is pg_basebackup's when the cluster's bin directory has
// it, else the SQL backup functions (pg_backup_start, a copy of the data
// directory, pg_backup_stop): the PostgreSQL 17 that `make pg17` installs
// has no client programs.
func (p *Cluster) FailoverStandby(ctx context.Context, slot string) (*Cluster, error) {
	return p.FailoverStandbyVia(ctx, slot, p.Addr())
}

// FailoverStandbyVia is FailoverStandby with the standby streaming from p
// through addr (host:port), such as a proxy in front of p that a test can
// cut. The base backup is taken from p directly.
func (p *Cluster) FailoverStandbyVia(ctx context.Context, slot, addr string) (*Cluster, error) {
	host, pport, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: standby's primary address: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	major, err := p.Major(ctx)
	if err != nil {
		return nil, err
	}
	if err := p.exec(ctx, `SELECT pg_create_physical_replication_slot($1, true)`, slot); err != nil {
		return nil, fmt.Errorf("pgcluster: create the standby's slot: %w", err)
	}
	s, err := p.newStandby()
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Cluster, error) { _ = os.RemoveAll(s.base); return nil, err }
	if _, err := os.Stat(p.Tool("pg_basebackup")); err == nil {
		err = s.run(ctx, "pg_basebackup", "-D", s.data, "-X", "none", "-c", "fast", "--no-sync",
			"-h", "127.0.0.1", "-p", strconv.Itoa(p.port), "-U", "postgres")
		if err != nil {
			return fail(err)
		}
	} else if err := p.sqlBackup(ctx, s.data); err != nil {
		return fail(err)
	}
	conf := fmt.Sprintf(`
# standby
port = %d
unix_socket_directories = '%s'
hot_standby = on
hot_standby_feedback = on
primary_conninfo = 'host=%s port=%s user=postgres dbname=postgres application_name=%s'
primary_slot_name = '%s'
`, s.port, s.data, host, pport, slot, slot)
	if major >= 17 {
		conf += "sync_replication_slots = on\nsynchronized_standby_slots = ''\n"
	}
	// postgresql.auto.conf is read last: its lines win over the primary's.
	if err := appendFile(filepath.Join(s.data, "postgresql.auto.conf"), conf); err != nil {
		return fail(err)
	}
	if err := appendFile(filepath.Join(s.data, "standby.signal"), ""); err != nil {
		return fail(err)
	}
	if err := s.firstStart(ctx); err != nil {
		s.Close()
		return nil, err
	}
	if major >= 17 {
		if err := p.exec(ctx, `ALTER SYSTEM SET synchronized_standby_slots = `+pgx.Identifier{slot}.Sanitize()); err != nil {
			s.Close()
			return nil, err
		}
		if err := p.exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// QueryStrings runs a query of one text column on p's postgres database
// and stores its rows in dest.
func (p *Cluster) QueryStrings(ctx context.Context, sql string, dest *[]string) error {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, sql)
	if err != nil {
		return err
	}
	*dest, err = pgx.CollectRows(rows, pgx.RowTo[string])
	return err
}

// Exec runs statements on p's postgres database.
func (p *Cluster) Exec(ctx context.Context, sql string, args ...any) error {
	return p.exec(ctx, sql, args...)
}

// exec runs one statement on p's postgres database.
func (p *Cluster) exec(ctx context.Context, sql string, args ...any) error {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql, args...)
	return err
}

// sqlBackup copies p's data directory into dir between pg_backup_start and
// pg_backup_stop, without its WAL (the standby streams it through its
// slot, which reserved it before the backup started) and without its
// replication slots, and writes the backup_label the backup's end returns.
func (p *Cluster) sqlBackup(ctx context.Context, dir string) error {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Both calls must be on one session.
	if _, err := conn.Exec(ctx, `SELECT pg_backup_start('oncekit standby', true)`); err != nil {
		return fmt.Errorf("pgcluster: pg_backup_start: %w", err)
	}
	if err := copyDataDir(p.data, dir); err != nil {
		_, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_backup_stop(false)`)
		return err
	}
	var label string
	if err := conn.QueryRow(ctx, `SELECT labelfile FROM pg_backup_stop(false)`).Scan(&label); err != nil {
		return fmt.Errorf("pgcluster: pg_backup_stop: %w", err)
	}
	return appendFile(filepath.Join(dir, "backup_label"), label)
}

// copyDataDir copies a running server's data directory, leaving out what
// a base backup leaves out: the WAL's files, the slots, the server's pid
// and temporary statistics. A file that vanishes meanwhile is skipped.
func copyDataDir(from, to string) error {
	skip := map[string]bool{"postmaster.pid": true, "postmaster.opts": true}
	empty := map[string]bool{"pg_wal": true, "pg_replslot": true, "pg_stat_tmp": true}
	return filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		if skip[rel] {
			return nil
		}
		parent := filepath.Dir(rel)
		if empty[parent] && !(parent == "pg_wal" && d.IsDir()) {
			return nil
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		dst := filepath.Join(to, rel)
		if d.IsDir() {
			if err := os.MkdirAll(dst, info.Mode().Perm()); err != nil {
				return err
			}
			return owned(dst)
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		if err := copyFile(path, dst, info.Mode().Perm()); errors.Is(err, fs.ErrNotExist) {
			return nil
		} else if err != nil {
			return err
		}
		return owned(dst)
	})
}

func copyFile(from, to string, mode fs.FileMode) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// appendFile appends text to the file at path (made if missing, owned by
// the server's user).
func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return owned(path)
}

// owned gives path to the postgres user when this process runs as root
// (the server runs as postgres).
func owned(path string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(path, uid, gid)
}
