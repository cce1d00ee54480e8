// `import fast_ulysses._cuda` loads this library; its TORCH_LIBRARY_IMPL blocks register the
// CUDA kernels and the group-management ops, and the module's functions are the group methods'
// eager way into the collectives (fast_entry.cpp).
#include <Python.h>

#include "ops/fast_entry.h"

static PyModuleDef module = {PyModuleDef_HEAD_INIT,
                             "_cuda",
                             "fast-ulysses CUDA transport",
                             -1,
                             fast_ulysses::ops::fast_entry_methods(),
                             nullptr,
                             nullptr,
                             nullptr,
                             nullptr};
PyMODINIT_FUNC PyInit__cuda(void) {
  return PyModule_Create(&module);
}
