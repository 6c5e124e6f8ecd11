package control

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestOneApply fails when a function other than the apply function
// (applyStored, and the records' own helpers it calls) writes the records
// or the scheduler's ledger. The exceptions are listed with their reason:
// the two things that enter memory ahead of the store and leave it when
// their transaction fails (doc.go, One apply).
func TestOneApply(t *testing.T) {
	allowed := map[string]string{
		// The apply function and the records' helpers it calls.
		"applyStored":        "the apply function",
		"applyRequestLocked": "applyStored's part for requests",
		"putLocked":          "the records' own index upkeep, called by applyStored",
		"dropLocked":         "the records' own index upkeep, called by applyStored",
		"release":            "cluster.release, the ledger's give-back that the functions listed here call",
		// Ahead of the store.
		"commit":          "a request being admitted enters memory before its transaction, and leaves it if it fails",
		"giveBack":        "a failed admission gives back the reservations its placement made",
		"placeOne":        "a placement whose record was not stored gives its reservation back",
		"placeGroupsOnce": "a group placement whose record was not stored gives its reservation back",
		"createCopy":      "a rebalance copy whose record was not stored gives its reservation back",
	}
	// What writes: record and request maps, the record index, and the
	// ledger's reservations.
	writes := func(n ast.Node) string {
		switch n := n.(type) {
		case *ast.CallExpr:
			if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "delete" && len(n.Args) > 0 && refersTo(n.Args[0], "requests") {
				return "delete(requests)"
			}
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok {
				return ""
			}
			switch name := sel.Sel.Name; {
			case name == "putLocked" || name == "dropLocked" || name == "applyRequestLocked":
				return name
			case (name == "put" || name == "delete") && refersTo(sel.X, "recs"):
				return "recs." + name
			case name == "release" && refersTo(sel.X, "cluster"):
				return "cluster.release"
			case (name == "Reserve" || name == "Hold" || name == "Release") && (refersTo(sel.X, "cluster") || refersTo(sel.X, "c")):
				return "cluster.c." + name
			}
		case *ast.AssignStmt:
			for _, l := range n.Lhs {
				if ix, ok := l.(*ast.IndexExpr); ok && refersTo(ix.X, "requests") {
					return "requests[...] ="
				}
			}
		}
		return ""
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	seen := map[string]bool{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				w := writes(n)
				if w == "" {
					return true
				}
				if _, ok := allowed[fd.Name.Name]; !ok {
					t.Errorf("%s: %s writes the records or the ledger (%s): only the apply function may", fset.Position(n.Pos()), fd.Name.Name, w)
				}
				seen[fd.Name.Name] = true
				return true
			})
		}
	}
	// An exception that no longer writes is dropped from the list.
	for name := range allowed {
		if !seen[name] {
			t.Errorf("%s is allowed to write the records or the ledger but does not: remove it from the list", name)
		}
	}
	if !slices.Contains(files, "apply.go") {
		t.Fatal("no apply.go: the test reads the package's own directory")
	}
}

// refersTo reports whether x names field, as s.field or s.x.field.
func refersTo(x ast.Expr, field string) bool {
	switch x := x.(type) {
	case *ast.SelectorExpr:
		return x.Sel.Name == field
	case *ast.Ident:
		return x.Name == field
	}
	return false
}
