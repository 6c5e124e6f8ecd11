package scheduler

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
)

// Expr is one parsed constraint or affinity in Swarm's syntax:
//
//	key==value    must match
//	key!=value    must not match
//	key==~value   should match (soft: honoured when possible, relaxed when not)
//	key!=~value   should not match (soft)
//
// A value is a literal ("ssd"), a glob with * ? or [...] ("web*"), or a
// regular expression between slashes ("/lin.*/"). Literals, globs and
// regular expressions all match the whole value. Parsing compiles the value
// once; matching never compiles.
type Expr struct {
	Key    string
	Negate bool // != instead of ==
	Soft   bool // ~ after the operator
	Value  string
	// Text is the expression as written, used in reasons.
	Text string

	re      *regexp.Regexp // nil for a literal
	literal bool
}

// exprCache holds parsed expressions by text, so that a constraint used by
// many requests is compiled once.
var (
	exprCache  sync.Map
	exprCached atomic.Int64
)

// ParseExpr parses one expression. The error names what is wrong but not the
// field; callers wrap it with the field path.
func ParseExpr(s string) (Expr, error) {
	if v, ok := exprCache.Load(s); ok {
		return v.(Expr), nil
	}
	e, err := parseExpr(s)
	if err == nil && exprCached.Add(1) <= maxCached {
		exprCache.Store(s, e)
	}
	return e, err
}

func parseExpr(s string) (Expr, error) {
	text := strings.TrimSpace(s)
	i := strings.Index(text, "==")
	j := strings.Index(text, "!=")
	e := Expr{Text: text}
	switch {
	case i < 0 && j < 0:
		return Expr{}, fmt.Errorf("%q: want key==value or key!=value (add ~ after the operator for a soft rule)", s)
	case j >= 0 && (i < 0 || j < i):
		e.Key, e.Value, e.Negate = text[:j], text[j+2:], true
	default:
		e.Key, e.Value = text[:i], text[i+2:]
	}
	e.Key = strings.TrimSpace(e.Key)
	if v, ok := strings.CutPrefix(e.Value, "~"); ok {
		e.Value, e.Soft = v, true
	}
	e.Value = strings.TrimSpace(e.Value)
	if e.Key == "" {
		return Expr{}, fmt.Errorf("%q: empty key", s)
	}
	if strings.ContainsAny(e.Key, " \t=!~") {
		return Expr{}, fmt.Errorf("%q: key %q must not contain spaces or = ! ~", s, e.Key)
	}
	switch {
	case len(e.Value) >= 2 && strings.HasPrefix(e.Value, "/") && strings.HasSuffix(e.Value, "/"):
		re, err := regexp.Compile("^(?:" + e.Value[1:len(e.Value)-1] + ")$")
		if err != nil {
			return Expr{}, fmt.Errorf("%q: bad regular expression: %v", s, err)
		}
		e.re = re
	case strings.ContainsAny(e.Value, "*?["):
		re, err := globRegexp(e.Value)
		if err != nil {
			return Expr{}, fmt.Errorf("%q: bad glob: %v", s, err)
		}
		e.re = re
	default:
		e.literal = true
	}
	return e, nil
}

// globRegexp turns a shell glob (* ? [class]) into an anchored expression.
func globRegexp(g string) (*regexp.Regexp, error) {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(g); i++ {
		switch c := g[i]; c {
		case '*':
			b.WriteString(".*")
		case '?':
			b.WriteString(".")
		case '[':
			end := strings.IndexByte(g[i:], ']')
			if end < 0 {
				return nil, fmt.Errorf("unclosed [ in %q", g)
			}
			class := g[i+1 : i+end]
			if strings.HasPrefix(class, "!") {
				class = "^" + class[1:]
			}
			b.WriteString("[" + class + "]")
			i += end
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	return regexp.Compile(b.String())
}

// MatchValue reports whether v matches the expression's value, ignoring
// Negate (the caller applies it, because a missing value is handled apart).
func (e *Expr) MatchValue(v string) bool {
	if e.literal {
		return v == e.Value
	}
	return e.re.MatchString(v)
}

// String returns the expression as written.
func (e Expr) String() string { return e.Text }
