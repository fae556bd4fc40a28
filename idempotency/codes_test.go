package idempotency

import (
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every problem code is declared in codes.go, in its one const block, named
// in the table of its doc comment, and has a title; no two share a value.
func TestProblemCodesLiveInOneBlock(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	codes := map[string]string{} // name -> value
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		require.NoError(t, err)
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				for i, id := range spec.(*ast.ValueSpec).Names {
					if !strings.HasPrefix(id.Name, "Code") || !id.IsExported() {
						continue
					}
					require.Equal(t, "codes.go", name, "%s is a problem code declared outside codes.go", id.Name)
					lit := spec.(*ast.ValueSpec).Values[i].(*ast.BasicLit)
					codes[id.Name] = constant.StringVal(constant.MakeFromLiteral(lit.Value, lit.Kind, 0))
				}
			}
		}
	}
	require.GreaterOrEqual(t, len(codes), 20)
	src, err := os.ReadFile("codes.go")
	require.NoError(t, err)
	table, _, _ := strings.Cut(string(src), "const (")
	seen := map[string]string{}
	for name, value := range codes {
		require.Contains(t, table, "//\t"+name+" ", "%s is not in codes.go's table", name)
		require.NotEmpty(t, problemTitles[value], "%s has no title", name)
		require.Empty(t, seen[value], "%s and %s share %s", name, seen[value], value)
		seen[value] = name
	}
	require.Len(t, problemTitles, len(codes), "a title without a code")
}
