// `import fast_ulysses._cuda` loads this library; its TORCH_LIBRARY_IMPL blocks register the
// CUDA kernels and the group-management ops.
#include <Python.h>

static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cuda", "fast-ulysses CUDA transport", -1,
                             nullptr, nullptr, nullptr, nullptr, nullptr};
PyMODINIT_FUNC PyInit__cuda(void) { return PyModule_Create(&module); }
