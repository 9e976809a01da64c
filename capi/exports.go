package main

/*
#include <stdint.h>
*/
import "C"

import "unsafe"

// The exports below only convert arguments and results; the behaviour and
// its documentation live in the api* functions and in tinyacc.h.

//export tinyacc_config_new
func tinyacc_config_new(text *C.char, out *C.int64_t) C.int {
	return call(func() error {
		s, err := cString("config text", text, true)
		if err != nil {
			return err
		}
		if err := outPtr("config", out); err != nil {
			return err
		}
		h, err := apiConfigNew(s)
		*out = C.int64_t(h)
		return err
	})
}

//export tinyacc_config_from_env
func tinyacc_config_from_env(file *C.char, out *C.int64_t) C.int {
	return call(func() error {
		s, err := cString("config file", file, true)
		if err != nil {
			return err
		}
		if err := outPtr("config", out); err != nil {
			return err
		}
		h, err := apiConfigFromEnv(s)
		*out = C.int64_t(h)
		return err
	})
}

//export tinyacc_config_json
func tinyacc_config_json(cfg C.int64_t, buf *C.char, cap C.int64_t, need *C.int64_t) C.int {
	return call(func() error {
		s, err := apiConfigJSON(int64(cfg))
		if err != nil {
			return err
		}
		return putString("config JSON", s, buf, cap, need)
	})
}

//export tinyacc_model_new
func tinyacc_model_new(cfg C.int64_t, out *C.int64_t) C.int {
	return handleCall("model", out, func() (int64, error) { return apiModelNew(int64(cfg)) })
}

//export tinyacc_model_save
func tinyacc_model_save(model C.int64_t, path *C.char) C.int {
	return pathCall(path, func(p string) error { return apiModelSave(int64(model), p) })
}

//export tinyacc_model_load
func tinyacc_model_load(model C.int64_t, path *C.char) C.int {
	return pathCall(path, func(p string) error { return apiModelLoad(int64(model), p) })
}

//export tinyacc_param_count
func tinyacc_param_count(model C.int64_t, count *C.int64_t) C.int {
	return call(func() error {
		if err := outPtr("count", count); err != nil {
			return err
		}
		names, err := apiParamNames(int64(model))
		*count = C.int64_t(len(names))
		return err
	})
}

//export tinyacc_param_name
func tinyacc_param_name(model C.int64_t, index C.int64_t, buf *C.char, cap C.int64_t, need *C.int64_t) C.int {
	return call(func() error {
		names, err := apiParamNames(int64(model))
		if err != nil {
			return err
		}
		if index < 0 || int(index) >= len(names) {
			return fail(errInvalidArg, "parameter index %d is outside [0, %d)", int64(index), len(names))
		}
		return putString("parameter name", names[index], buf, cap, need)
	})
}

//export tinyacc_param_shape
func tinyacc_param_shape(model C.int64_t, name *C.char, dims *C.int64_t, cap C.int64_t, ndim *C.int64_t) C.int {
	return call(func() error {
		n, err := cString("parameter name", name, false)
		if err != nil {
			return err
		}
		shape, err := apiParamShape(int64(model), n)
		if err != nil {
			return err
		}
		if ndim != nil {
			*ndim = C.int64_t(len(shape))
		}
		if int(cap) < len(shape) || (len(shape) > 0 && dims == nil) {
			return fail(errSize, "parameter %s has %d dimensions but dims holds %d", n, len(shape), int64(cap))
		}
		out := unsafe.Slice((*int64)(unsafe.Pointer(dims)), len(shape))
		for i, d := range shape {
			out[i] = int64(d)
		}
		return nil
	})
}

//export tinyacc_param_get
func tinyacc_param_get(model C.int64_t, name *C.char, out *C.float, n C.int64_t) C.int {
	return paramCall(name, "output buffer", out, n, func(s string, buf []float32) error { return apiParamGet(int64(model), s, buf, false) })
}

//export tinyacc_grad_get
func tinyacc_grad_get(model C.int64_t, name *C.char, out *C.float, n C.int64_t) C.int {
	return paramCall(name, "output buffer", out, n, func(s string, buf []float32) error { return apiParamGet(int64(model), s, buf, true) })
}

//export tinyacc_param_set
func tinyacc_param_set(model C.int64_t, name *C.char, in *C.float, n C.int64_t) C.int {
	return paramCall(name, "input buffer", in, n, func(s string, buf []float32) error { return apiParamSet(int64(model), s, buf) })
}

//export tinyacc_generate
func tinyacc_generate(model C.int64_t, prompt *C.int32_t, nPrompt C.int64_t, nNew C.int64_t, temperature C.double, topK C.int64_t, seed C.int64_t, out *C.int32_t) C.int {
	return call(func() error {
		p, err := i32s("prompt", prompt, nPrompt)
		if err != nil {
			return err
		}
		dst, err := i32s("output buffer", out, nNew)
		if err != nil {
			return err
		}
		toks, err := apiGenerate(int64(model), p, int(nNew), float64(temperature), int(topK), int64(seed))
		if err != nil {
			return err
		}
		copy(dst, toks[len(toks)-len(dst):])
		return nil
	})
}

//export tinyacc_optimizer_new
func tinyacc_optimizer_new(cfg C.int64_t, model C.int64_t, out *C.int64_t) C.int {
	return handleCall("optimizer", out, func() (int64, error) { return apiOptimizerNew(int64(cfg), int64(model)) })
}

//export tinyacc_optimizer_save
func tinyacc_optimizer_save(opt C.int64_t, path *C.char) C.int {
	return pathCall(path, func(p string) error { return apiOptimizerSave(int64(opt), p) })
}

//export tinyacc_optimizer_load
func tinyacc_optimizer_load(opt C.int64_t, path *C.char) C.int {
	return pathCall(path, func(p string) error { return apiOptimizerLoad(int64(opt), p) })
}

//export tinyacc_loader_new
func tinyacc_loader_new(cfg C.int64_t, out *C.int64_t) C.int {
	return handleCall("loader", out, func() (int64, error) { return apiLoaderNew(int64(cfg)) })
}

//export tinyacc_loader_info
func tinyacc_loader_info(loader C.int64_t, batch, seq, accum, tokens *C.int64_t) C.int {
	return call(func() error {
		B, T, A, n, err := apiLoaderInfo(int64(loader))
		if err != nil {
			return err
		}
		for _, o := range []struct {
			p *C.int64_t
			v int
		}{{batch, B}, {seq, T}, {accum, A}, {tokens, n}} {
			if o.p != nil {
				*o.p = C.int64_t(o.v)
			}
		}
		return nil
	})
}

//export tinyacc_loader_batch
func tinyacc_loader_batch(loader C.int64_t, step, micro C.int64_t, x, y *C.int32_t, n C.int64_t) C.int {
	return call(func() error {
		xs, err := i32s("x", x, n)
		if err != nil {
			return err
		}
		ys, err := i32s("y", y, n)
		if err != nil {
			return err
		}
		return apiLoaderBatch(int64(loader), int(step), int(micro), xs, ys)
	})
}

// pathCall runs fn with the Go string of a required path argument.
func pathCall(path *C.char, fn func(p string) error) C.int {
	return call(func() error {
		p, err := cString("path", path, false)
		if err != nil {
			return err
		}
		return fn(p)
	})
}

// handleCall stores the handle fn creates in *out (named name in errors).
func handleCall(name string, out *C.int64_t, fn func() (int64, error)) C.int {
	return call(func() error {
		if err := outPtr(name, out); err != nil {
			return err
		}
		h, err := fn()
		*out = C.int64_t(h)
		return err
	})
}

// paramCall decodes a parameter name and a caller float32 buffer of n
// elements (what = "input buffer" or "output buffer", for errors) for fn.
func paramCall(name *C.char, what string, p *C.float, n C.int64_t, fn func(s string, buf []float32) error) C.int {
	return call(func() error {
		s, err := cString("parameter name", name, false)
		if err != nil {
			return err
		}
		buf, err := f32s(what, p, n)
		if err != nil {
			return err
		}
		return fn(s, buf)
	})
}
