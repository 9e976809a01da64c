package main

import (
	"fmt"
	"sync"
)

// The registry maps handles to Go objects. Handles are never reused (they
// count up from 1), so a freed handle can be told apart from one that never
// existed, and a stale handle can never alias a newer object.
var registry = struct {
	sync.Mutex
	objs map[int64]any
	next int64
}{objs: map[int64]any{}}

// register stores obj and returns its new handle.
func register(obj any) int64 {
	registry.Lock()
	defer registry.Unlock()
	registry.next++
	registry.objs[registry.next] = obj
	return registry.next
}

// lookup returns the object of handle h, or a TINYACC_ERR_HANDLE error that
// says whether h was freed or never issued.
func lookup(h int64) (any, error) {
	registry.Lock()
	defer registry.Unlock()
	if obj, ok := registry.objs[h]; ok {
		return obj, nil
	}
	if h > 0 && h <= registry.next {
		return nil, fail(errBadHandle, "handle %d was already freed", h)
	}
	return nil, fail(errBadHandle, "handle %d is not a tinyacc handle (never issued)", h)
}

// get returns handle h as a *T, with an error naming both kinds when h
// holds something else (a model passed where a session is expected).
func get[T any](h int64) (*T, error) {
	obj, err := lookup(h)
	if err != nil {
		return nil, err
	}
	t, ok := obj.(*T)
	if !ok {
		var want *T
		return nil, fail(errBadHandle, "handle %d is a %s, not a %s", h, kindName(obj), kindName(want))
	}
	return t, nil
}

// getOptional is get for arguments where 0 means "none".
func getOptional[T any](h int64) (*T, error) {
	if h == 0 {
		return nil, nil
	}
	return get[T](h)
}

// freeHandle drops handle h. The object stays alive while others use it (a
// model freed after prepare keeps training inside its session).
func freeHandle(h int64) error {
	if _, err := lookup(h); err != nil {
		return err
	}
	registry.Lock()
	obj := registry.objs[h]
	delete(registry.objs, h)
	registry.Unlock()
	if r, ok := obj.(interface{ release() }); ok {
		r.release()
	}
	return nil
}

// kindName names the kind of a registry object in error messages.
func kindName(obj any) string {
	switch obj.(type) {
	case *configObj:
		return "config"
	case *modelObj:
		return "model"
	case *optimizerObj:
		return "optimizer"
	case *loaderObj:
		return "data loader"
	case *session:
		return "session"
	case *lossObj:
		return "loss"
	case *bufferObj:
		return "buffer"
	case *reducerObj:
		return "reducer"
	case *pendingObj:
		return "started collective"
	}
	return fmt.Sprintf("%T", obj)
}
