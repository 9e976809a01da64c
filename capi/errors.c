// Thread-local storage for the message of the last failed call. It lives on
// the C side because a Go goroutine is not an OS thread, while callers of
// the library (C programs, Python through ctypes) think in threads: the
// exported Go function runs on the calling thread, so a __thread variable
// written from it is exactly "the last error of this thread".
#include <stdlib.h>
#include <string.h>

static __thread char *tinyacc_err_msg;

void tinyacc_err_set(const char *msg, size_t n) {
	char *m = malloc(n + 1);
	if (m == NULL) {
		return; // keep the previous message rather than crash
	}
	memcpy(m, msg, n);
	m[n] = 0;
	free(tinyacc_err_msg);
	tinyacc_err_msg = m;
}

const char *tinyacc_err_get(void) {
	return tinyacc_err_msg ? tinyacc_err_msg : "";
}
