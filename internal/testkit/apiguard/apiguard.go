// Package apiguard lists a module's exported API, one line per identifier in
// the manner of the Go project's api/*.txt files, and checks a later listing
// against a released one: a line that is gone is an incompatible change,
// allowed only when the changelog's Unreleased section names it.
package apiguard

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// List returns the exported API of every package of the module rooted at
// dir whose import path is modulePath/…, sorted: the packages' exported
// functions, methods, types with their exported fields and interface
// methods, constants and variables. Test files, main packages, internal
// packages, directories holding another module and testdata are left out.
func List(dir, modulePath string) ([]string, error) {
	var lines []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		name := d.Name()
		if rel != "." && (name == "internal" || name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || exists(filepath.Join(p, "go.mod"))) {
			return filepath.SkipDir
		}
		pkg := modulePath
		if rel != "." {
			pkg = path.Join(modulePath, rel)
		}
		got, err := listDir(p, pkg)
		lines = append(lines, got...)
		return err
	})
	slices.Sort(lines)
	return slices.Compact(lines), err
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// listDir lists the exported API of the package in dir.
func listDir(dir, pkg string) ([]string, error) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var lines []string
	for name, p := range pkgs {
		if name == "main" {
			continue
		}
		for _, f := range p.Files {
			for _, decl := range f.Decls {
				lines = append(lines, declLines(fset, pkg, decl)...)
			}
		}
	}
	return lines, nil
}

func declLines(fset *token.FileSet, pkg string, decl ast.Decl) []string {
	prefix := "pkg " + pkg + ", "
	var out []string
	switch d := decl.(type) {
	case *ast.FuncDecl:
		if !d.Name.IsExported() {
			return nil
		}
		if d.Recv == nil {
			return []string{prefix + "func " + d.Name.Name + signature(fset, d.Type)}
		}
		recv := expr(fset, d.Recv.List[0].Type)
		if !ast.IsExported(strings.TrimLeft(recv, "*")) {
			return nil
		}
		return []string{prefix + "method (" + recv + ") " + d.Name.Name + signature(fset, d.Type)}
	case *ast.GenDecl:
		for _, spec := range d.Specs {
			switch s := spec.(type) {
			case *ast.TypeSpec:
				if s.Name.IsExported() {
					out = append(out, typeLines(fset, prefix, s)...)
				}
			case *ast.ValueSpec:
				kind := "var"
				if d.Tok == token.CONST {
					kind = "const"
				}
				for _, n := range s.Names {
					if !n.IsExported() {
						continue
					}
					line := prefix + kind + " " + n.Name
					if s.Type != nil {
						line += " " + expr(fset, s.Type)
					}
					out = append(out, line)
				}
			}
		}
	}
	return out
}

func typeLines(fset *token.FileSet, prefix string, s *ast.TypeSpec) []string {
	name := s.Name.Name
	if s.TypeParams != nil {
		name += fieldList(fset, s.TypeParams, "[", "]", true)
	}
	if s.Assign.IsValid() {
		return []string{prefix + "type " + name + " = " + expr(fset, s.Type)}
	}
	switch t := s.Type.(type) {
	case *ast.StructType:
		out := []string{prefix + "type " + name + " struct"}
		for _, f := range t.Fields.List {
			typ := expr(fset, f.Type)
			if len(f.Names) == 0 {
				if ast.IsExported(strings.TrimLeft(typ[strings.LastIndex(typ, ".")+1:], "*")) {
					out = append(out, prefix+"type "+name+" struct, embedded "+typ)
				}
				continue
			}
			for _, n := range f.Names {
				if n.IsExported() {
					out = append(out, prefix+"type "+name+" struct, "+n.Name+" "+typ)
				}
			}
		}
		return out
	case *ast.InterfaceType:
		out := []string{prefix + "type " + name + " interface"}
		for _, m := range t.Methods.List {
			if len(m.Names) == 0 {
				out = append(out, prefix+"type "+name+" interface, embedded "+expr(fset, m.Type))
				continue
			}
			for _, n := range m.Names {
				if n.IsExported() {
					out = append(out, prefix+"type "+name+" interface, "+n.Name+signature(fset, m.Type.(*ast.FuncType)))
				}
			}
		}
		return out
	}
	return []string{prefix + "type " + name + " " + expr(fset, s.Type)}
}

// signature prints a function type without parameter names: renaming a
// parameter is not a change of the API.
func signature(fset *token.FileSet, f *ast.FuncType) string {
	s := ""
	if f.TypeParams != nil {
		s += fieldList(fset, f.TypeParams, "[", "]", true)
	}
	s += fieldList(fset, f.Params, "(", ")", false)
	if f.Results != nil && len(f.Results.List) > 0 {
		r := fieldList(fset, f.Results, "(", ")", false)
		if len(f.Results.List) == 1 && len(f.Results.List[0].Names) <= 1 {
			r = strings.TrimSuffix(strings.TrimPrefix(r, "("), ")")
		}
		s += " " + r
	}
	return s
}

func fieldList(fset *token.FileSet, l *ast.FieldList, open, close string, names bool) string {
	var parts []string
	for _, f := range l.List {
		typ := expr(fset, f.Type)
		n := max(len(f.Names), 1)
		for i := range n {
			if names && len(f.Names) > 0 {
				parts = append(parts, f.Names[i].Name+" "+typ)
			} else {
				parts = append(parts, typ)
			}
		}
	}
	return open + strings.Join(parts, ", ") + close
}

func expr(fset *token.FileSet, e ast.Expr) string {
	var b bytes.Buffer
	if err := printer.Fprint(&b, fset, e); err != nil {
		return fmt.Sprintf("<%v>", err)
	}
	return strings.Join(strings.Fields(b.String()), " ")
}

// Check returns the lines of released that current no longer holds and
// whose identifier unreleased (the changelog's Unreleased section) does not
// name: the incompatible changes nobody recorded.
func Check(released, current []string, unreleased string) []string {
	have := make(map[string]bool, len(current))
	for _, l := range current {
		have[l] = true
	}
	var bad []string
	for _, l := range released {
		if l == "" || have[l] {
			continue
		}
		if !strings.Contains(unreleased, Identifier(l)) {
			bad = append(bad, l)
		}
	}
	return bad
}

// Identifier names a line's identifier as the changelog writes it:
// package.Name, or package.Type.Member for a field, a method or an
// interface's method, e.g. "outbox.RelayConfig.Lease".
func Identifier(line string) string {
	rest, ok := strings.CutPrefix(line, "pkg ")
	if !ok {
		return line
	}
	pkgPath, decl, _ := strings.Cut(rest, ", ")
	pkg := path.Base(pkgPath)
	fields := strings.Fields(decl)
	if len(fields) < 2 {
		return pkg
	}
	name := func(s string) string {
		s = strings.TrimLeft(s, "(*")
		if i := strings.IndexAny(s, "[(),"); i >= 0 {
			s = s[:i]
		}
		return s
	}
	switch fields[0] {
	case "method":
		recv := name(fields[1])
		return pkg + "." + recv + "." + name(fields[2])
	case "type":
		typ := name(fields[1])
		if _, member, ok := strings.Cut(decl, ", "); ok {
			m := strings.Fields(member)
			if m[0] == "embedded" && len(m) > 1 {
				emb := strings.TrimLeft(m[1], "*")
				return pkg + "." + typ + "." + name(emb[strings.LastIndex(emb, ".")+1:])
			}
			return pkg + "." + typ + "." + name(m[0])
		}
		return pkg + "." + typ
	}
	return pkg + "." + name(fields[1])
}
