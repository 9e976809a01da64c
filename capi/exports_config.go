package main

/*
#include <stdint.h>
*/
import "C"

//export tinyacc_config_resolve
func tinyacc_config_resolve(file, text, args *C.char, out *C.int64_t) C.int {
	return call(func() error {
		f, err := cString("config file", file, true)
		if err != nil {
			return err
		}
		s, err := cString("config text", text, true)
		if err != nil {
			return err
		}
		a, err := cString("config flags", args, true)
		if err != nil {
			return err
		}
		if err := outPtr("config", out); err != nil {
			return err
		}
		h, err := apiConfigResolve(f, s, a)
		*out = C.int64_t(h)
		return err
	})
}
