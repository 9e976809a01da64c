"""Ctrl-C and SIGTERM in a script: every rank stops at the same step
boundary, as `tinyacc train` does.

The launcher forwards a signal to every rank, but each rank gets it at its
own moment, maybe in the middle of a collective: a rank that stopped there
would leave the others waiting until comm.timeout. So the handler only
records the signal. At each step boundary (the prepared DataLoader about to
hand out the first micro-batch of an optimizer step) the ranks agree on it
with one all-reduce of one number (the largest signal number any rank
got), and all stop at the same boundary: save_state when a checkpoint
directory is registered, trackers flushed, exit status 128 + the signal
(130 for SIGINT, 143 for SIGTERM). A second signal before that boundary
stops the rank at once, as without tinyacc.

Handlers are installed only where the script left Python's defaults, and
only from the main thread.
"""

import signal
import sys
import threading

NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


class Interrupts:
    def __init__(self, rank):
        self.rank = rank
        self.signum = 0           # the first signal this rank got, 0 for none
        self.received = threading.Event()
        self.previous = {}

    def install(self):
        if threading.current_thread() is not threading.main_thread():
            return
        for s, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
            if signal.getsignal(s) is default:
                self.previous[s] = default
                signal.signal(s, self._handle)

    def restore(self):
        for s, h in self.previous.items():
            signal.signal(s, h)
        self.previous = {}

    def _handle(self, signum, frame):
        if self.signum:
            self.restore()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        self.signum = signum
        self.received.set()
        sys.stderr.write("tinyacc: rank %d got %s; stopping at the next step boundary (send it again to stop now)\n"
                         % (self.rank, NAMES.get(signum, signum)))
        sys.stderr.flush()
