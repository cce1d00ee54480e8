// The collectives' Autograd kernels (autograd_kernels.cpp) and the debug hook of the owned op's
// backward.
#pragma once

#include <Python.h>

namespace fast_ulysses::ops {

// Sets (a callable) or clears (None) the hook the owned op's backward hands its call to before
// anything is sent: hook(group_name, grad, mode, tag, seq_splits, head_splits, layout). With the
// GIL held. FAST_ULYSSES_DEBUG's groups set it (fast_ulysses.debug).
void set_backward_check(PyObject* hook);

}  // namespace fast_ulysses::ops
