// The methods of `fast_ulysses._cuda` (fast_entry.cpp): UlyssesGroup's eager way into its ops.
#pragma once

#include <Python.h>

namespace fast_ulysses::ops {

// A null-terminated method table for the module's definition.
PyMethodDef* fast_entry_methods();

}  // namespace fast_ulysses::ops
