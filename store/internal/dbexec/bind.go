package dbexec

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// List is a parameter that stands for several values: Numbered expands it in place.
type List []any

// ListOf returns v as a List.
func ListOf[T any](v []T) List {
	out := make(List, len(v))
	for i, x := range v {
		out[i] = x
	}
	return out
}

// Numbered rewrites a statement written with numbered parameters into one with plain ? placeholders,
// for databases whose own placeholders cannot be repeated (MySQL) or that take no list (neither
// MySQL nor SQLite has arrays). In the statement:
//
//   - ?N is the Nth argument; it may appear any number of times, each one bound again;
//   - a List argument expands to ?, ?, … (NULL when empty, which no IN list matches);
//   - #N is the number of values of the Nth argument when it is a List (a literal integer).
//
// Quoted strings and -- comments are left alone.
func Numbered(query string, args []any) (string, []any, error) {
	var (
		b   strings.Builder
		out = make([]any, 0, len(args))
	)
	b.Grow(len(query) + 16)
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case c == '\'':
			j := i + 1
			for j < len(query) {
				if query[j] == '\'' {
					if j+1 < len(query) && query[j+1] == '\'' {
						j += 2
						continue
					}
					break
				}
				j++
			}
			b.WriteString(query[i:min(j+1, len(query))])
			i = j
		case c == '-' && i+1 < len(query) && query[i+1] == '-':
			j := strings.IndexByte(query[i:], '\n')
			if j < 0 {
				j = len(query) - i
			}
			b.WriteString(query[i : i+j])
			i += j - 1
		case (c == '?' || c == '#') && i+1 < len(query) && query[i+1] >= '0' && query[i+1] <= '9':
			j := i + 1
			for j < len(query) && query[j] >= '0' && query[j] <= '9' {
				j++
			}
			n, _ := strconv.Atoi(query[i+1 : j])
			if n < 1 || n > len(args) {
				return "", nil, fmt.Errorf("statement refers to parameter %d of %d", n, len(args))
			}
			arg := args[n-1]
			list, isList := arg.(List)
			switch {
			case c == '#':
				if !isList {
					return "", nil, fmt.Errorf("#%d: parameter %d is not a list", n, n)
				}
				b.WriteString(strconv.Itoa(len(list)))
			case isList && len(list) == 0:
				b.WriteString("NULL")
			case isList:
				for k, v := range list {
					if k > 0 {
						b.WriteString(", ")
					}
					b.WriteByte('?')
					out = append(out, v)
				}
			default:
				b.WriteByte('?')
				out = append(out, arg)
			}
			i = j - 1
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), out, nil
}

// WithNumbered returns db with every statement rewritten by Numbered.
func WithNumbered(db DB) DB { return numberedDB{numberedQ{db}, db} }

type numberedQ struct{ q Querier }

func (n numberedQ) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	query, args, err := Numbered(query, args)
	if err != nil {
		return 0, err
	}
	return n.q.Exec(ctx, query, args...)
}

func (n numberedQ) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	query, args, err := Numbered(query, args)
	if err != nil {
		return nil, err
	}
	return n.q.Query(ctx, query, args...)
}

func (n numberedQ) QueryRow(ctx context.Context, query string, args ...any) Row {
	query, args, err := Numbered(query, args)
	if err != nil {
		return errRow{err}
	}
	return n.q.QueryRow(ctx, query, args...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type numberedDB struct {
	numberedQ
	db DB
}

func (d numberedDB) Begin(ctx context.Context, o TxOptions) (Tx, error) {
	tx, err := d.db.Begin(ctx, o)
	if err != nil {
		return nil, err
	}
	return numberedTx{numberedQ{tx}, tx}, nil
}

func (d numberedDB) Conn(ctx context.Context) (Conn, error) {
	c, err := d.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	return numberedConn{numberedQ{c}, c}, nil
}

type numberedConn struct {
	numberedQ
	c Conn
}

func (c numberedConn) Begin(ctx context.Context, o TxOptions) (Tx, error) {
	tx, err := c.c.Begin(ctx, o)
	if err != nil {
		return nil, err
	}
	return numberedTx{numberedQ{tx}, tx}, nil
}

func (c numberedConn) Release(discard bool) { c.c.Release(discard) }

// WithNumberedTx returns tx with every statement rewritten by Numbered.
func WithNumberedTx(tx Tx) Tx { return numberedTx{numberedQ{tx}, tx} }

type numberedTx struct {
	numberedQ
	tx Tx
}

func (t numberedTx) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t numberedTx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }
func (t numberedTx) User() any                          { return t.tx.User() }

// IsNil reports whether v is nil or a nil pointer, map, slice or interface.
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Interface, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}
