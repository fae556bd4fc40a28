package pguuid

import (
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// Register makes m encode github.com/google/uuid's UUID as PostgreSQL's
// uuid directly. Without it pgx encodes a uuid.UUID through its
// driver.Valuer: the text form, a failed binary encode that builds an error,
// a parse back to bytes, then the binary encode, several microseconds of CPU
// per value. The wire values are the same either way. Only the uuid type
// (and uuid[], whose elements it encodes) is affected: a uuid.UUID bound to a
// text column is still sent as its text. Registering twice is a no-op.
func Register(m *pgtype.Map) {
	if t, ok := m.TypeForOID(pgtype.UUIDOID); ok {
		if _, done := t.Codec.(uuidCodec); done {
			return
		}
	}
	t := &pgtype.Type{Name: "uuid", OID: pgtype.UUIDOID, Codec: uuidCodec{}}
	m.RegisterType(t)
	m.RegisterType(&pgtype.Type{Name: "_uuid", OID: pgtype.UUIDArrayOID, Codec: &pgtype.ArrayCodec{ElementType: t}})
	// Where nothing describes a parameter (default_query_exec_mode=exec, the
	// mode behind a transaction pooler), pgx picks its type from the Go
	// value: without these, a slice of UUIDs has none and cannot be sent.
	for _, v := range []any{uuid.UUID{}, [16]byte{}} {
		m.RegisterDefaultPgType(v, "uuid")
	}
	for _, v := range []any{[]uuid.UUID(nil), [][16]byte(nil)} {
		m.RegisterDefaultPgType(v, "_uuid")
	}
}

// uuidCodec is pgx's UUIDCodec with plans for uuid.UUID first.
type uuidCodec struct{ pgtype.UUIDCodec }

func (c uuidCodec) PlanEncode(m *pgtype.Map, oid uint32, format int16, value any) pgtype.EncodePlan {
	if _, ok := value.(uuid.UUID); ok {
		switch format {
		case pgtype.BinaryFormatCode:
			return encodeUUIDBinary{}
		case pgtype.TextFormatCode:
			return encodeUUIDText{}
		}
	}
	return c.UUIDCodec.PlanEncode(m, oid, format, value)
}

type encodeUUIDBinary struct{}

func (encodeUUIDBinary) Encode(value any, buf []byte) ([]byte, error) {
	u := value.(uuid.UUID)
	return append(buf, u[:]...), nil
}

type encodeUUIDText struct{}

func (encodeUUIDText) Encode(value any, buf []byte) ([]byte, error) {
	return append(buf, value.(uuid.UUID).String()...), nil
}
