package main

// Exports of the training session: prepare, the step pieces, evaluation.

/*
#include <stdint.h>
*/
import "C"

import "unsafe"

//export tinyacc_prepare
func tinyacc_prepare(cfg, model, opt, loader C.int64_t, out *C.int64_t) C.int {
	return handleCall("session", out, func() (int64, error) { return apiPrepare(int64(cfg), int64(model), int64(opt), int64(loader)) })
}

//export tinyacc_forward
func tinyacc_forward(sess C.int64_t, x, y *C.int32_t, batch, seq C.int64_t, loss *C.int64_t, value *C.double) C.int {
	return call(func() error {
		if batch < 0 || seq < 0 {
			return fail(errInvalidArg, "forward: batch %d and seq %d must be positive", int64(batch), int64(seq))
		}
		xs, err := i32s("x", x, batch*seq)
		if err != nil {
			return err
		}
		ys, err := i32s("y", y, batch*seq)
		if err != nil {
			return err
		}
		h, v, err := apiForward(int64(sess), xs, ys, int(batch), int(seq), loss != nil)
		if err != nil {
			return err
		}
		if loss != nil {
			*loss = C.int64_t(h)
		}
		if value != nil {
			*value = C.double(v)
		}
		return nil
	})
}

//export tinyacc_loss_value
func tinyacc_loss_value(loss C.int64_t, value *C.double) C.int {
	return call(func() error {
		if err := outPtr("value", value); err != nil {
			return err
		}
		v, err := apiLossValue(int64(loss))
		*value = C.double(v)
		return err
	})
}

//export tinyacc_backward
func tinyacc_backward(loss C.int64_t) C.int {
	return call(func() error { return apiBackward(int64(loss)) })
}

//export tinyacc_step
func tinyacc_step(sess C.int64_t, stepped *C.int32_t) C.int {
	return call(func() error {
		did, err := apiStep(int64(sess))
		if stepped != nil {
			*stepped = 0
			if did {
				*stepped = 1
			}
		}
		return err
	})
}

//export tinyacc_zero_grad
func tinyacc_zero_grad(sess C.int64_t) C.int {
	return call(func() error { return apiZeroGrad(int64(sess)) })
}

//export tinyacc_train_step
func tinyacc_train_step(sess C.int64_t, x, y *C.int32_t, n C.int64_t, loss *C.double) C.int {
	return call(func() error {
		xs, err := i32s("x", x, n)
		if err != nil {
			return err
		}
		ys, err := i32s("y", y, n)
		if err != nil {
			return err
		}
		v, err := apiTrainStep(int64(sess), xs, ys)
		if loss != nil {
			*loss = C.double(v)
		}
		return err
	})
}

//export tinyacc_run_step
func tinyacc_run_step(sess C.int64_t, loss *C.double) C.int {
	return call(func() error {
		v, err := apiRunStep(int64(sess))
		if loss != nil {
			*loss = C.double(v)
		}
		return err
	})
}

//export tinyacc_evaluate
func tinyacc_evaluate(sess C.int64_t, loss *C.double) C.int {
	return call(func() error {
		if err := outPtr("loss", loss); err != nil {
			return err
		}
		v, err := apiEvaluate(int64(sess))
		*loss = C.double(v)
		return err
	})
}

//export tinyacc_clip_grad_norm
func tinyacc_clip_grad_norm(sess C.int64_t, maxNorm C.double, norm *C.double) C.int {
	return call(func() error {
		v, err := apiClipGradNorm(int64(sess), float64(maxNorm))
		if norm != nil {
			*norm = C.double(v)
		}
		return err
	})
}

//export tinyacc_metrics
func tinyacc_metrics(sess C.int64_t, out *C.double, n C.int64_t) C.int {
	return call(func() error {
		if n != numMetrics || out == nil {
			return fail(errSize, "metrics: the buffer must hold exactly %d doubles (TINYACC_NUM_METRICS), got %d", numMetrics, int64(n))
		}
		m, err := apiMetrics(int64(sess))
		if err != nil {
			return err
		}
		dst := unsafe.Slice((*float64)(unsafe.Pointer(out)), numMetrics)
		copy(dst, m[:])
		return nil
	})
}

//export tinyacc_session_state
func tinyacc_session_state(sess C.int64_t, step, micro *C.int64_t) C.int {
	return call(func() error {
		s, m, err := apiSessionState(int64(sess))
		if step != nil {
			*step = C.int64_t(s)
		}
		if micro != nil {
			*micro = C.int64_t(m)
		}
		return err
	})
}

//export tinyacc_set_step
func tinyacc_set_step(sess C.int64_t, step C.int64_t) C.int {
	return call(func() error { return apiSetStep(int64(sess), int(step)) })
}

//export tinyacc_save_checkpoint
func tinyacc_save_checkpoint(sess C.int64_t, dir *C.char) C.int {
	return call(func() error {
		d, err := cString("save_checkpoint: directory", dir, false)
		if err != nil {
			return err
		}
		return apiSaveCheckpoint(int64(sess), d)
	})
}

//export tinyacc_load_checkpoint
func tinyacc_load_checkpoint(sess C.int64_t, dir *C.char, step *C.int64_t) C.int {
	return call(func() error {
		d, err := cString("load_checkpoint: directory", dir, false)
		if err != nil {
			return err
		}
		s, err := apiLoadCheckpoint(int64(sess), d)
		if err == nil && step != nil {
			*step = C.int64_t(s)
		}
		return err
	})
}
