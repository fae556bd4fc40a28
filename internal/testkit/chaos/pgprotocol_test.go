package chaos

import (
	"bytes"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestIsCommitSQL(t *testing.T) {
	t.Parallel()
	for sql, want := range map[string]bool{
		"commit": true, "COMMIT": true, " Commit ;": true, "end": true, "END;": true,
		"commit work": true, "COMMIT  TRANSACTION": true, "end transaction": true,
		"rollback": false, "select 1": false, "commit prepared 'x'": false,
		"insert into t values (1); commit": false, "": false, "committed": false,
	} {
		assert.Equalf(t, want, isCommitSQL(sql), "%q", sql)
	}
}

// encode frames frontend messages as a client sends them.
func encode(t *testing.T, msgs ...pgproto3.FrontendMessage) []byte {
	t.Helper()
	var b []byte
	var err error
	for _, m := range msgs {
		b, err = m.Encode(b)
		require.NoError(t, err)
	}
	return b
}

func TestCommitTrackerFollowsStatementsAndPortals(t *testing.T) {
	t.Parallel()
	stream := encode(t,
		&pgproto3.Query{String: "BEGIN"},
		&pgproto3.Query{String: "commit"}, // pgx Tx.Commit
		// pgx batch, first time: prepare, then bind and execute.
		&pgproto3.Parse{Name: "stmtcache_1", Query: "INSERT INTO t VALUES ($1)"},
		&pgproto3.Parse{Name: "stmtcache_2", Query: "COMMIT"},
		&pgproto3.Describe{ObjectType: 'S', Name: "stmtcache_2"},
		&pgproto3.Sync{},
		&pgproto3.Bind{PreparedStatement: "stmtcache_1"},
		&pgproto3.Execute{},
		&pgproto3.Bind{PreparedStatement: "stmtcache_2"},
		&pgproto3.Execute{}, // the COMMIT
		&pgproto3.Sync{},
		// Later batches bind the cached statement without a Parse.
		&pgproto3.Bind{PreparedStatement: "stmtcache_2", DestinationPortal: "p"},
		&pgproto3.Execute{Portal: "p"}, // the COMMIT
		&pgproto3.Close{ObjectType: 'S', Name: "stmtcache_2"},
		&pgproto3.Bind{PreparedStatement: "stmtcache_2"},
		&pgproto3.Execute{}, // no longer a COMMIT: the statement was closed
		// The unnamed statement is replaced by the next Parse.
		&pgproto3.Parse{Query: "end"},
		&pgproto3.Parse{Query: "SELECT 1"},
		&pgproto3.Bind{},
		&pgproto3.Execute{},
		&pgproto3.Terminate{},
	)
	var commitsAt []int
	tr := newCommitTracker()
	r := bytes.NewReader(stream)
	for i := 0; r.Len() > 0; i++ {
		m, err := readMessage(r)
		require.NoError(t, err)
		if tr.commits(m) {
			commitsAt = append(commitsAt, i)
		}
	}
	assert.Equal(t, []int{1, 9, 12}, commitsAt)
}

func TestReadStartupMessage(t *testing.T) {
	t.Parallel()
	b := encode(t, &pgproto3.SSLRequest{}, &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber, Parameters: map[string]string{"user": "postgres"}})
	r := bytes.NewReader(b)
	_, code, err := readStartupMessage(r)
	require.NoError(t, err)
	assert.EqualValues(t, pgSSLRequest, code)
	m, code, err := readStartupMessage(r)
	require.NoError(t, err)
	assert.EqualValues(t, pgproto3.ProtocolVersionNumber, code)
	assert.Equal(t, b[8:], m.raw)
	_, err = readMessage(bytes.NewReader([]byte{'Q', 0, 0, 0, 1}))
	assert.ErrorIs(t, err, errPGFraming)
}

// FuzzCommitTracker feeds arbitrary client bytes to the message reader and
// the tracker: they must never panic.
func FuzzCommitTracker(f *testing.F) {
	f.Add([]byte{'Q', 0, 0, 0, 11, 'c', 'o', 'm', 'm', 'i', 't', 0})
	f.Add([]byte{'B', 0, 0, 0, 4})
	f.Add([]byte{'C', 0, 0, 0, 5, 'S'})
	f.Fuzz(func(t *testing.T, data []byte) {
		tr := newCommitTracker()
		r := bytes.NewReader(data)
		for {
			m, err := readMessage(r)
			if err != nil {
				return
			}
			tr.commits(m)
		}
	})
}
