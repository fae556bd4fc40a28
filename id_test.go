package oncekit_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit"
)

// The golden vectors pin DeriveID and DeriveKey forever: if this test fails,
// the change breaks every retry that crosses a deploy. Do not update them.
func TestDeriveGolden(t *testing.T) {
	t.Parallel()
	cases := []struct {
		parts []string
		id    string
		key   string
	}{
		{nil, "e113fc7e-9b56-8027-9da7-fe11789aeba7",
			"d2214a561b46b18535b83b6de85fef199257d3f33aaa9e3033fbf13024ea6dbf"},
		{[]string{""}, "c2f80114-ebce-83a5-bae8-15a7d5eee1e0",
			"dc0d6df180768a873555e360ecbc366ecacda95cfe0954823b70ffd049e5d285"},
		{[]string{"ab", "c"}, "bdcc29c5-721a-88ac-8fdb-80ccc8f81b59",
			"dd07c9e50f2b18d78056eafc7c42e0d852b2637c7acb76a426420112522d1847"},
		{[]string{"a", "bc"}, "5d3bdfe2-ede5-8272-a5f9-e0c9a82296b9",
			"0985458be0e52d592455754e1a1263e887146609b967efc56187d71ac9d098b0"},
		{[]string{"tenant-1", "7f3c2a"}, "c4a2c9e8-5c56-83fc-8b50-247238ea3595",
			"2f97f2365a589a710250c79c4d52dba66783894067f70e32d3b7cdb91f73bfe6"},
		{[]string{"pay_123", "PaymentCreated"}, "49c2fa10-0174-8368-b7f7-4a776ae84452",
			"94eb7f197910fd72caa1fd6468279513bda56bdad0118f2a767d29f37c733d23"},
		{[]string{"évènement", "ключ", "鍵"}, "26cda897-4a79-8fd3-b8b6-374369036776",
			"0561ca6f35b1578ff91c6f608005db5356627b78fafe3b11b5cd5535f8bf2abb"},
	}
	for _, c := range cases {
		require.Equal(t, c.id, oncekit.DeriveID(c.parts...).String(), "DeriveID%q", c.parts)
		require.Equal(t, c.key, oncekit.DeriveKey(c.parts...), "DeriveKey%q", c.parts)
	}
}

func TestDeriveDistinguishesBoundaries(t *testing.T) {
	t.Parallel()
	pairs := [][2][]string{
		{{"ab", "c"}, {"a", "bc"}},
		{{"a"}, {"a", ""}},
		{{}, {""}},
		{{"a", "b"}, {"b", "a"}},
	}
	for _, p := range pairs {
		require.NotEqual(t, oncekit.DeriveID(p[0]...), oncekit.DeriveID(p[1]...), "%q vs %q", p[0], p[1])
		require.NotEqual(t, oncekit.DeriveKey(p[0]...), oncekit.DeriveKey(p[1]...), "%q vs %q", p[0], p[1])
	}
}

func TestDeriveIDIsVersion8(t *testing.T) {
	t.Parallel()
	id := oncekit.DeriveID("x")
	require.EqualValues(t, 8, id.Version())
	require.Equal(t, "RFC4122", id.Variant().String())
	require.NotEqual(t, oncekit.DeriveKey("x")[:32], id.String(), "ID and key use separate domains")
}
