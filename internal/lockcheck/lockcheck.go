// Package lockcheck finds I/O done while a mutex is held: the statements
// between a named mutex field's Lock and Unlock (or to the function's end
// after a deferred Unlock) must not call, directly or through the
// module's own functions, anything that makes a system call or sleeps.
//
// It reads the source with full type information (golang.org/x/tools/go/
// packages) and follows static calls. A function literal counts as run
// where it is called in place or passed as an argument, not where it is
// returned or stored (a deferred action built under the lock and run after
// it is allowed). A function parameter called under the lock is followed
// to what every caller passes for it. Other calls through an interface or
// a function value are not followed. Logging through log/slog is not
// counted as I/O.
package lockcheck

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"strings"

	"golang.org/x/tools/go/packages"
	"golang.org/x/tools/go/types/typeutil"
)

// Lock names the mutex to check: the field Field of the struct type Type
// declared in package Package.
type Lock struct {
	Package, Type, Field string
}

// Finding is one call under the lock that reaches I/O.
type Finding struct {
	Pos token.Position
	// Chain is the call path from the call under the lock to the I/O
	// primitive, outermost first ("(*Daemon).publish", ..., "os.ReadFile").
	Chain []string
}

func (f Finding) String() string {
	return fmt.Sprintf("%s: %s", f.Pos, strings.Join(f.Chain, " → "))
}

// primitivePackages are the packages any call into is I/O; the functions
// of pureInIO are the exceptions.
var primitivePackages = []string{
	"os", "os/exec", "os/signal", "syscall", "golang.org/x/sys/unix",
	"net", "net/http", "io/ioutil",
	"github.com/cilium/ebpf", "github.com/containerd/cgroups/v3",
	"github.com/coreos/go-systemd/v22",
}

// pureInIO are functions of the primitive packages that make no system
// call.
var pureInIO = map[string]bool{
	"os.IsNotExist": true, "os.IsExist": true, "os.IsPermission": true,
	"os.Getenv": true, "os.LookupEnv": true, "os.Getpid": true,
	"net/http.StatusText": true, "net.ParseIP": true,
}

// otherPrimitives are single functions outside those packages that block.
var otherPrimitives = map[string]bool{
	"time.Sleep": true, "path/filepath.Walk": true, "path/filepath.WalkDir": true,
	"path/filepath.Glob": true, "path/filepath.EvalSymlinks": true,
}

// Check loads patterns (relative to dir) and reports every call made under
// lock that reaches I/O.
func Check(dir string, lock Lock, patterns ...string) ([]Finding, error) {
	cfg := &packages.Config{
		Dir:  dir,
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedSyntax | packages.NeedTypes | packages.NeedTypesInfo | packages.NeedImports,
	}
	pkgs, err := packages.Load(cfg, patterns...)
	if err != nil {
		return nil, fmt.Errorf("load %v: %w", patterns, err)
	}
	var errs []string
	packages.Visit(pkgs, nil, func(p *packages.Package) {
		for _, e := range p.Errors {
			errs = append(errs, e.Error())
		}
	})
	if len(errs) > 0 {
		return nil, fmt.Errorf("load %v: %s", patterns, strings.Join(errs, "; "))
	}
	c := &checker{decls: map[*types.Func]declIn{}, memo: map[*types.Func][]string{}, lock: lock,
		params: map[*types.Var]param{}, lockedParams: map[param]bool{}}
	var target *packages.Package
	for _, p := range pkgs {
		for _, f := range p.Syntax {
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
					if fn, ok := p.TypesInfo.Defs[fd.Name].(*types.Func); ok {
						c.decls[fn] = declIn{fd, p}
						params := fn.Type().(*types.Signature).Params()
						for i := range params.Len() {
							c.params[params.At(i)] = param{fn, i}
						}
					}
				}
			}
		}
		if p.PkgPath == lock.Package {
			target = p
		}
	}
	if target == nil {
		return nil, fmt.Errorf("package %s is not among %v", lock.Package, patterns)
	}
	for _, f := range target.Syntax {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				if n.Body != nil {
					c.region(target, n.Body.List, false)
				}
			case *ast.FuncLit:
				c.region(target, n.Body.List, false)
			}
			return true
		})
	}
	c.passedUnderLock(pkgs)
	return c.findings, nil
}

// passedUnderLock checks what every caller passes for a function
// parameter that its function calls under the lock.
func (c *checker) passedUnderLock(pkgs []*packages.Package) {
	for _, p := range pkgs {
		for _, f := range p.Syntax {
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				fn := typeutil.StaticCallee(p.TypesInfo, call)
				for i, a := range call.Args {
					if fn == nil || !c.lockedParams[param{fn, i}] {
						continue
					}
					switch a := a.(type) {
					case *ast.FuncLit:
						c.calls(p, a.Body)
					case *ast.Ident, *ast.SelectorExpr:
						if passed, ok := p.TypesInfo.Uses[identOf(a)].(*types.Func); ok {
							if chain := c.reaches(passed); chain != nil {
								c.findings = append(c.findings, Finding{Pos: p.Fset.Position(a.Pos()), Chain: chain})
							}
						}
					}
				}
				return true
			})
		}
	}
}

func identOf(e ast.Expr) *ast.Ident {
	if sel, ok := e.(*ast.SelectorExpr); ok {
		return sel.Sel
	}
	return e.(*ast.Ident)
}

type declIn struct {
	decl *ast.FuncDecl
	pkg  *packages.Package
}

// param is a function's parameter by its index.
type param struct {
	fn    *types.Func
	index int
}

type checker struct {
	lock Lock
	// params are the target package's functions' parameters;
	// lockedParams those of function type called under the lock.
	params       map[*types.Var]param
	lockedParams map[param]bool
	decls        map[*types.Func]declIn
	memo         map[*types.Func][]string // nil: no I/O; visiting marks a cycle
	visiting     map[*types.Func]bool
	findings     []Finding
}

// region walks a statement list, locked telling whether the lock is held
// on entry, and checks what runs while it is held. A nested block starts
// with the state of its enclosing statement; what it ends with (an
// Unlock before a return) does not carry out of it.
func (c *checker) region(p *packages.Package, stmts []ast.Stmt, locked bool) {
	for _, s := range stmts {
		switch c.lockOp(p, s) {
		case "Lock":
			locked = true
			continue
		case "Unlock":
			locked = false
			continue
		case "defer":
			continue // held to the end of the function
		}
		switch s := s.(type) {
		case *ast.BlockStmt:
			c.region(p, s.List, locked)
		case *ast.IfStmt:
			c.stmtCalls(p, s.Init, locked)
			c.exprCalls(p, s.Cond, locked)
			c.region(p, s.Body.List, locked)
			if s.Else != nil {
				c.region(p, []ast.Stmt{s.Else}, locked)
			}
		case *ast.ForStmt:
			c.stmtCalls(p, s.Init, locked)
			c.exprCalls(p, s.Cond, locked)
			c.stmtCalls(p, s.Post, locked)
			c.region(p, s.Body.List, locked)
		case *ast.RangeStmt:
			c.exprCalls(p, s.X, locked)
			c.region(p, s.Body.List, locked)
		case *ast.SwitchStmt:
			c.stmtCalls(p, s.Init, locked)
			c.exprCalls(p, s.Tag, locked)
			c.region(p, s.Body.List, locked)
		case *ast.TypeSwitchStmt:
			c.stmtCalls(p, s.Init, locked)
			c.stmtCalls(p, s.Assign, locked)
			c.region(p, s.Body.List, locked)
		case *ast.SelectStmt:
			c.region(p, s.Body.List, locked)
		case *ast.CaseClause:
			for _, e := range s.List {
				c.exprCalls(p, e, locked)
			}
			c.region(p, s.Body, locked)
		case *ast.CommClause:
			c.stmtCalls(p, s.Comm, locked)
			c.region(p, s.Body, locked)
		case *ast.LabeledStmt:
			c.region(p, []ast.Stmt{s.Stmt}, locked)
		case *ast.GoStmt:
			// Runs beside the caller, not under its lock; its arguments
			// are evaluated here.
			for _, a := range s.Call.Args {
				c.exprCalls(p, a, locked)
			}
		default:
			c.stmtCalls(p, s, locked)
		}
	}
}

// lockOp tells whether s is lock.Field.Lock(), .Unlock() or a deferred
// Unlock on a value of lock.Type.
func (c *checker) lockOp(p *packages.Package, s ast.Stmt) string {
	var call *ast.CallExpr
	deferred := false
	switch s := s.(type) {
	case *ast.ExprStmt:
		call, _ = s.X.(*ast.CallExpr)
	case *ast.DeferStmt:
		call, deferred = s.Call, true
	}
	if call == nil {
		return ""
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Lock" && sel.Sel.Name != "Unlock" {
		return ""
	}
	field, ok := sel.X.(*ast.SelectorExpr)
	if !ok || field.Sel.Name != c.lock.Field || !c.isLockType(p.TypesInfo.TypeOf(field.X)) {
		return ""
	}
	switch {
	case deferred && sel.Sel.Name == "Unlock":
		return "defer"
	case deferred:
		return ""
	}
	return sel.Sel.Name
}

func (c *checker) isLockType(t types.Type) bool {
	if ptr, ok := t.(*types.Pointer); ok {
		t = ptr.Elem()
	}
	n, ok := t.(*types.Named)
	return ok && n.Obj().Name() == c.lock.Type && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == c.lock.Package
}

func (c *checker) stmtCalls(p *packages.Package, s ast.Stmt, locked bool) {
	if s != nil && locked {
		c.calls(p, s)
	}
}

func (c *checker) exprCalls(p *packages.Package, e ast.Expr, locked bool) {
	if e != nil && locked {
		c.calls(p, e)
	}
}

// calls reports each call in n that reaches I/O, and notes the calls of
// parameters.
func (c *checker) calls(p *packages.Package, n ast.Node) {
	ast.Inspect(n, func(n ast.Node) bool {
		if call, ok := n.(*ast.CallExpr); ok {
			if id, ok := call.Fun.(*ast.Ident); ok {
				if v, ok := p.TypesInfo.Uses[id].(*types.Var); ok {
					if pr, ok := c.params[v]; ok {
						c.lockedParams[pr] = true
					}
				}
			}
		}
		return true
	})
	eachCall(p, n, func(call *ast.CallExpr, fn *types.Func) {
		if chain := c.reaches(fn); chain != nil {
			c.findings = append(c.findings, Finding{Pos: p.Fset.Position(call.Pos()), Chain: chain})
		}
	})
}

// eachCall calls f with every static call in n that runs when n does:
// not those in function literals returned or stored for later, nor in a
// go statement.
func eachCall(p *packages.Package, n ast.Node, f func(*ast.CallExpr, *types.Func)) {
	ast.Inspect(n, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GoStmt:
			for _, a := range n.Call.Args {
				eachCall(p, a, f)
			}
			return false
		case *ast.CallExpr:
			if fn := typeutil.StaticCallee(p.TypesInfo, n); fn != nil {
				f(n, fn)
			}
			// Literals called in place or passed to the call run with it.
			if lit, ok := n.Fun.(*ast.FuncLit); ok {
				eachCall(p, lit.Body, f)
			}
			for _, a := range n.Args {
				if lit, ok := a.(*ast.FuncLit); ok {
					eachCall(p, lit.Body, f)
				}
			}
		case *ast.FuncLit:
			return false
		}
		return true
	})
}

// reaches is the call chain from fn to an I/O primitive, or nil.
func (c *checker) reaches(fn *types.Func) []string {
	name := funcName(fn)
	if isPrimitive(fn) {
		return []string{name}
	}
	if chain, done := c.memo[fn]; done {
		return chain
	}
	d, ok := c.decls[fn]
	if !ok || c.visiting[fn] {
		return nil // outside the loaded code, or a cycle already being followed
	}
	if c.visiting == nil {
		c.visiting = map[*types.Func]bool{}
	}
	c.visiting[fn] = true
	var chain []string
	eachCall(d.pkg, d.decl.Body, func(_ *ast.CallExpr, callee *types.Func) {
		if chain != nil {
			return
		}
		if sub := c.reaches(callee); sub != nil {
			chain = append([]string{name}, sub...)
		}
	})
	delete(c.visiting, fn)
	c.memo[fn] = chain
	return chain
}

func isPrimitive(fn *types.Func) bool {
	if fn.Pkg() == nil {
		return false
	}
	name := funcName(fn)
	if pureInIO[name] {
		return false
	}
	if otherPrimitives[name] {
		return true
	}
	path := fn.Pkg().Path()
	for _, prim := range primitivePackages {
		if path == prim || strings.HasPrefix(path, prim+"/") {
			return true
		}
	}
	return false
}

// funcName is pkg.Func or pkg.(*Type).Method.
func funcName(fn *types.Func) string {
	path := ""
	if fn.Pkg() != nil {
		path = fn.Pkg().Path()
	}
	sig, _ := fn.Type().(*types.Signature)
	if sig == nil || sig.Recv() == nil {
		return path + "." + fn.Name()
	}
	t := sig.Recv().Type()
	star := ""
	if ptr, ok := t.(*types.Pointer); ok {
		t, star = ptr.Elem(), "*"
	}
	tn := t.String()
	if n, ok := t.(*types.Named); ok {
		tn = n.Obj().Name()
	}
	return fmt.Sprintf("%s.(%s%s).%s", path, star, tn, fn.Name())
}
